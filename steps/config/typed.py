"""A validated config section as its dataclass: `typed(PerfConfig, params)`.

The section's dataclass declares its keys (the step's knobs inherited from StepOptions, the
model's from GPTConfig: one declaration each); the defaults come from the schema, which
validation has already filled in, so a section's own fields need none. Nested dataclass fields
(`model`) are built from their dicts, tuple fields from their lists. The dict stays what the job
logs and hashes (MLflow params, the Snakemake params); the stage reads the typed object.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Self

from steps.config.base import ConfigError

__all__ = ["TRAJECTORY", "Section", "field_names", "trajectory_fields", "typed"]

# field metadata: a key that defines what is trained (data, schedule, optimiser hyperparameters),
# not how fast: a run that changes one follows another trajectory, its loss is not comparable
TRAJECTORY = {"trajectory": True}
# keys of every stage section that the job runner reads (steps/core/job.py: a cell's seed group)
JOB_KEYS = ("seeds",)


def typed(cls, params):
    """`params` (a validated section dict, or already a `cls`) as a `cls`."""
    if isinstance(params, cls):
        return params
    hints = typing.get_type_hints(cls)
    names = field_names(cls)
    # what the job runner reads, not the stage (a section may still declare it: word2vec's seeds)
    params = {k: v for k, v in params.items() if k not in JOB_KEYS or k in names}
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field {unknown}: declare it there (and in its schema)")
    kw = {}
    for name, value in params.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = typed(hint, value)
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            value = tuple(value)
        kw[name] = value
    return cls(**kw)


def field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def trajectory_fields(cls) -> tuple[str, ...]:
    """The fields marked TRAJECTORY (inherited ones included)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("trajectory"))


class Section:
    """Base of a section's dataclass: `Cls.of(params)` is the resolved section (a dict) as a Cls."""

    @classmethod
    def of(cls, params) -> Self:
        return typed(cls, params)
