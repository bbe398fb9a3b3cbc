"""MLflow, and only MLflow: the store, each job's run, the lab run, what the UI shows. The job
runner (steps/core/job.py) opens a job's run here and hands it to its StageRun. Only it, the stage
modules, the report, and the command lines that read a store (steps.ui, steps.compare,
steps.campaign) import this package; library packages never do (tests/test_layers.py).

mlflow_run.py   the MLflow run of one job: tags, params, buffered metrics, status
store.py        the tracking store (SQLite lock, retries, one experiment per stage)
server.py       a tracking server that does not answer: the DAG's preflight, the job's one line
portable.py     a copied or moved store's artifact locations follow it
lab.py          the lab run of one `snakemake` invocation
provenance.py   package versions, git commit
datasets.py     the job's inputs, logged as MLflow datasets
describe.py     what the UI shows in words: experiment descriptions, run notes, UI addresses
outputs.py      finished results that cannot be trusted (no run in the store): moved aside, redone
"""
