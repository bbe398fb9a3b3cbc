"""The lab's core: what every module may import, and what imports neither torch, JAX nor MLflow.

errors.py   SkipCell, InputError: what a stage or a library raises on purpose
stage.py    Stage: the contract of a stage module (its `run` and what its report section shows)
run.py      StageRun, what `run(ctx)` gets: config, paths, logging, device
cli.py      the job's command line: --cfg, --input/--output NAME=PATH
job.py      the job's life: open the MLflow run (steps.tracking), seed once, call `run`, write metrics.json
seeding.py  one seed for every RNG, torch's thread count
device.py   the torch device from common.device
sources.py  a hash of the code a stage runs (its Snakemake rule records it: an edit reruns the stage)
runcache.py the run cache: a job run before restored from its entry instead of recomputed

The dependency goes one way: core.job opens the job's MLflow run with steps.tracking (MLflow only)
and hands it to StageRun; nothing in steps.tracking imports core.
"""

from __future__ import annotations

import importlib

# `from steps.core import StageRun` loads steps.core.run when asked, not with the package: the run
# cache's restore (`python -m steps.core.runcache`, every job's first command) starts without numpy,
# tqdm and jsonschema.
_EXPORTS = {
    "InputError": "steps.core.errors",
    "SkipCell": "steps.core.errors",
    "StageRun": "steps.core.run",
    "Stage": "steps.core.stage",
}

__all__ = ["InputError", "SkipCell", "Stage", "StageRun"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
