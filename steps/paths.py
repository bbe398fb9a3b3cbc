"""Where the tracking store lives. Paths are relative to the working directory (Snakemake's
`--directory`), so tests can run the whole DAG in a temporary folder.

The DAG's files (corpus, tokenizer, MCQ splits, each job's metrics.json) are not here: Snakemake
is their single source, and every job gets its paths from its rule (`--input`/`--output`,
workflow/rules/common.smk; `ctx.inputs`, `ctx.outputs` in a stage)."""

from pathlib import Path

RESULTS = Path("results")
MLFLOW_DB = RESULTS / "mlflow.db"
ARTIFACTS = RESULTS / "mlartifacts"
