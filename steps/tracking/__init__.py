"""One MLflow run per Snakemake job (see steps/stage.py for the contract every stage module keeps).

errors.py      SkipCell, InputError
cli.py         the job's command line: --cfg, --input/--output NAME=PATH
job.py         the job's life: open the run, seed once, call `run`, write metrics.json
run.py         StageRun, what `run(ctx)` gets: config, paths, logging, device
mlflow_run.py  the MLflow run: tags, params, buffered metrics, status
env.py         seeding, torch threads, the torch device
provenance.py  package versions, git commit
store.py       the tracking store (SQLite lock, retries, one experiment per stage)
"""

from steps.tracking.errors import InputError, SkipCell
from steps.tracking.run import StageRun

__all__ = ["InputError", "SkipCell", "StageRun"]
