"""The lab's stages and everything they share (docs/pipeline.md: the module map).

A process that imports this under `snakemake` (a job: `python -m steps.<stage>`) starts watching that
snakemake here, before its stage's heavy imports: it never outlives it (steps/lifeline.py). Then, where
the DAG runs a job server (steps/jobserver.py: local runs), the job is handed to it, forked from a
process that has MLflow and torch loaded, and this process waits for its exit status.
"""

from steps import jobserver as _jobserver
from steps import lifeline as _lifeline

_lifeline.die_with_snakemake()
_jobserver.delegate()
