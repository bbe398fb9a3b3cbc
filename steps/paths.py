"""Where every stage reads and writes. All paths are relative to the working directory
(Snakemake's `--directory`), so tests can run the whole DAG in a temporary folder."""
from pathlib import Path

RESULTS = Path("results")
DATA = RESULTS / "data"
CORPUS_DIR = DATA / "corpus"            # HF datasets.DatasetDict (train/validation), save_to_disk
TOKENIZER_DIR = DATA / "tokenizer"      # AutoTokenizer.from_pretrained(TOKENIZER_DIR)
MCQ_DIR = DATA / "mcq"                  # train.csv, validation.csv, test.csv (Kaggle format)
MLFLOW_DB = RESULTS / "mlflow.db"
ARTIFACTS = RESULTS / "mlartifacts"
REPORTS = RESULTS / "reports"


def stage_dir(stage: str, cell: str = "main") -> Path:
    return RESULTS / stage / cell


def metrics_path(stage: str, cell: str = "main") -> Path:
    return stage_dir(stage, cell) / "metrics.json"
