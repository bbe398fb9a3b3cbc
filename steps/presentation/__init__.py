"""What each stage shows, one light module per stage (`SHOWN = Presentation(...)`, steps/core/stage.py):
its report columns, headline, curves, tables and figures, and the params its MLflow runs list. The
stage module builds its STAGE from it and the report reads it (`presentation(stage)`), so the report
never imports a stage's libraries (torch, JAX, transformers): keep these modules free of them at
module level (tests/test_layers.py)."""

# The stage rules in the order the workflow defines them (workflow/Snakefile's includes, then each
# rules file's order): DAG order, in which `python -m steps.compare` lists the stages without parsing
# the Snakefile (tests/test_compare.py checks this list against Snakemake's own parse).
STAGE_ORDER = (
    "prepare_corpus",
    "train_tokenizer",
    "prepare_mcq",
    "word2vec",
    "mcq_finetune",
    "components",
    "gpt_parity",
    "gpt_train",
    "inference",
    "minitorch",
    "perf",
    "sharding",
    "scale",
    "report",
)
