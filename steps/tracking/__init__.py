"""One MLflow run per Snakemake job, opened and closed by `stage_main`.

Every stage module ends with ``stage_main("<stage>", run)`` where ``run(ctx) -> dict`` does the
work and returns its final metrics. `stage_main` parses the job's resolved config, opens the run
with the reproducibility tags, closes runs a killed job left RUNNING, ends the run FAILED on any
error, and writes ``results/<stage>/<cell>/metrics.json`` (run id + final metrics) as the job's
file output, which is how the report knows which runs belong to this DAG.
"""
from steps.tracking.run import InputError, SkipCell, StageRun, stage_main

__all__ = ["InputError", "SkipCell", "StageRun", "stage_main"]
