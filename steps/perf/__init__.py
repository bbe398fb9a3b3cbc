"""perf: the single-device performance matrix and memory accounting (the seed's "single card
perf" table). The stage is this package: `python -m steps.perf` (see __main__.py); the cell logic
is in stage.py, the training step and its knobs in step.py, memory in memory.py, the fused
kernels in fused.py (+ triton_kernels.py on CUDA).

This package's own import stays light: `python -m steps.perf` re-executes itself with a malloc
setting before any real work (__main__.py). So `run` imports the cell logic when a cell runs; what
the stage shows (columns, headline, figures) is steps/presentation/perf.py. (The ladder's cells are expanded by the
config, `steps/config/ladder.py`.)
"""

from __future__ import annotations

from steps.core import Stage
from steps.presentation.perf import SHOWN


def run(ctx):
    from steps.perf.stage import run as run_cell  # see the module docstring: not at planning time

    return run_cell(ctx)


STAGE = Stage.of(__spec__.name, run, SHOWN)
