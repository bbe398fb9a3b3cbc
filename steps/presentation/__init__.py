"""What each stage shows, one light module per stage (`SHOWN = Presentation(...)`, steps/core/stage.py):
its report columns, headline, curves, tables and figures, and the params its MLflow runs list. The
stage module builds its STAGE from it and the report reads it (`presentation(stage)`), so the report
never imports a stage's libraries (torch, JAX, transformers): keep these modules free of them at
module level (tests/test_layers.py).

This package sits below steps.core and steps.tracking and imports neither: the job runner
(steps/core/stage.py: `Stage`, a Presentation with its `run`) and the MLflow views
(steps/tracking/views.py) both read a stage's presentation from here."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

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

COLUMN_KINDS = ("metrics", "info", "params")


@dataclass(frozen=True, kw_only=True)
class Presentation:
    """What a stage shows: its report section and the params its MLflow run lists (docstring above)."""

    columns: Mapping[str, str] = field(default_factory=dict)
    derived: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    headline: tuple[str, str, str] | None = None
    headline_if: tuple[str, object] | None = None
    headline_none: str = ""
    headline_interval: tuple[str, str] | None = None
    headline_of: tuple[str, str] | None = None
    curves: Sequence[str] = ()
    tables: Sequence[str] = ()
    figures: Callable | None = None
    params_used: Callable[[dict], dict] | None = None
    columns_for: Callable[[dict], Sequence[str]] | None = None
    measured: Sequence[str] = ()
    system_metrics: bool = False

    def __post_init__(self):
        where = getattr(self, "module", "Presentation")
        for title, ref in self.columns.items():
            kind, dot, key = ref.partition(".")
            if kind not in COLUMN_KINDS or not dot or not key:
                raise ValueError(f"{where}: column {title!r} -> {ref!r}: expected one of {COLUMN_KINDS} + '.<key>'")
        for title, (how, column, _cell) in self.derived.items():
            if how not in ("ratio", "diff") or column not in self.columns:
                raise ValueError(
                    f"{where}: derived {title!r}: ({how!r}, {column!r}) needs ratio|diff of a declared column"
                )
        titles = {*self.columns, *self.derived}
        named = [("headline", self.headline[1] if self.headline else None)]
        named += [("headline_if", self.headline_if[0] if self.headline_if else None)]
        named += [("headline_interval", c) for c in self.headline_interval or ()]
        named += [("headline_of", self.headline_of[0] if self.headline_of else None)]
        named += [("measured", c) for c in self.measured]
        for what, column in named:
            if column is not None and column not in titles:
                raise ValueError(f"{where}: {what} column {column!r} is not a column")
        if (self.headline_if or self.headline_interval or self.headline_none or self.headline_of) and not self.headline:
            raise ValueError(f"{where}: headline_if/headline_none/headline_interval/headline_of need a headline")


def presentation(stage: str) -> Presentation:
    """What `stage` shows (`steps/presentation/<stage>.py`), without importing its module's libraries.
    LookupError for a name with no presentation module (a run logged by hand under another name)."""
    name = f"steps.presentation.{stage}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise LookupError(f"{name} does not exist: {stage!r} is not a stage of the lab") from None
    shown = getattr(module, "SHOWN", None)
    if not isinstance(shown, Presentation):
        raise LookupError(f"steps.presentation.{stage} has no SHOWN = Presentation(...)")
    return shown
