"""The stage contract: one small object per stage module, read by the module's `main`, the report
and the tests. What a stage shows is declared once, in its own light module
`steps/presentation/<stage>.py` (`SHOWN = Presentation(columns={...}, headline=(...), ...)`: no
torch, JAX or transformers, so the report reads every stage's without loading them), and every stage
module (`steps/<stage>.py`, or the package `steps/<stage>/`) ends with

    STAGE = Stage.of(__spec__.name, run, SHOWN)

    if __name__ == "__main__":
        STAGE.main()

and its Snakemake rule carries the same name (`rule <stage>:` runs `python -m steps.<stage>`,
workflow/rules/common.smk). The name is never typed: it is the module's own name.

`run(ctx: StageRun) -> dict` does the work and returns the cell's final metrics (numbers land in
metrics.json's `metrics` and in MLflow, anything else in `info`). The report shapes the stage's
section from its Presentation:

  columns   {"title": "metrics.<key>" | "info.<key>" | "params.<key>"}      one row per cell
  derived   {"title": ("ratio" | "diff", "<column title>", "<reference cell>")}
  headline  ("what the number is", "<column title>", "max" | "min")          the index line
  headline_if        ("<column title>", value): only rows whose column holds `value` compete
                     for the headline (e.g. a ratio's verdict "faster": its interval excludes 1)
  headline_none      what the index line says when no row qualifies
  headline_interval  ("<low column>", "<high column>"): shown with the value, "v [low, high]"
  headline_of        ("<count column>", "<what is counted>"): the denominator, "v on N <what>"
  curves    ["<metric key logged with steps>", ...]      plotted per cell from MLflow history
  tables    ["<name>", ...]        tables the cells logged (<cell folder>/<name>.csv), stacked
  figures   f(table, plots_dir, folders) -> [png paths]   stage-specific plots; `folders` maps
            each cell to its job's folder (where its metrics.json is)
  params_used  f(params) -> the params that mean something for this cell, what its MLflow run
            shows (e.g. a gensim cell has no optimizer); the config hash and metrics.json keep
            the whole resolved config
  columns_for  f(params) -> the column titles a cell of these params fills, where a stage's cells
            measure different things (miniTorch: ops, GPT, classifier); None = every column
  measured  ["<column title>", ...]: columns whose values time, rate or depend on the process
            (a speed-up, a latency, a throughput gain) beyond what steps/report/values.py's TIMED
            pattern already names: left out of the report values that must repeat run to run
  system_metrics  True for stages that train: their runs log MLflow's system metrics (CPU, memory;
            GPU on CUDA), steps/tracking/mlflow_run.py

tests/test_stage_contract.py checks every column against what `run` returned on the smoke DAG.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from typing import Callable

from steps.core.run import StageRun
from steps.presentation import COLUMN_KINDS, Presentation, presentation  # noqa: F401  (the contract's other half)


@dataclass(frozen=True)
class Stage(Presentation):
    module: str  # the module's import name: `__spec__.name`
    run: Callable[[StageRun], dict]
    # the stage trains its `seeds` itself (word2vec); else the job runs `run` once per seed (job.py)
    own_seeds: bool = False

    @classmethod
    def of(cls, module: str, run: Callable[[StageRun], dict], shown: Presentation, own_seeds: bool = False) -> "Stage":
        """The stage of `module`: its `run` and its presentation (steps/presentation/<stage>.py)."""
        return cls(module, run, **{f.name: getattr(shown, f.name) for f in fields(Presentation)}, own_seeds=own_seeds)

    @property
    def name(self) -> str:
        """The stage, its rule and its MLflow experiment: the module's last name part."""
        return self.module.rpartition(".")[2]

    def main(self, argv: list[str] | None = None) -> None:
        """`python -m steps.<stage> --cfg JSON --output metrics=PATH [--input NAME=PATH ...]`."""
        from steps.core.job import run_job  # imported when a job starts; job.py needs Stage for types only

        run_job(self, argv)


def load(stage: str) -> Stage:
    """The Stage object of `steps.<stage>` (imports the module: its libraries come with it)."""
    obj = getattr(importlib.import_module(f"steps.{stage}"), "STAGE", None)
    if not isinstance(obj, Stage) or obj.name != stage:
        raise LookupError(f"steps.{stage} has no STAGE = Stage.of(__spec__.name, run, SHOWN)")
    return obj
