"""Sweeps: one knob of one stage over a list of values, each value a cell of the stage (and each
cell its `seeds`: a seed group), so one command runs them all and the report, `python -m
steps.compare --sweep` and MLflow show the outcome against the value.

    sweep:
      mcq_finetune.lr: [1.0e-5, 3.0e-5, 1.0e-4]                        # <stage>.<knob>
      minitorch.cells.classifier_fast.classifier.lr: [1.0e-3, 3.0e-2]   # <stage>.cells.<cell>.<knob>

A key is the knob's path as it is written in the config: `<stage>.<knob>` (a nested knob dotted,
`gpt_train.model.n_layer`) sweeps the stage's base cell, which is the stage's section where it
declares no `cells:` (its one cell `main`) and else the first cell the stage selects;
`<stage>.cells.<cell>.<knob>` names the base cell. Each value is one cell: the base cell's
overrides with the knob set to the value, named `sweep_<knob>_<value>` (`sweep_<cell>.<knob>_<value>`
where the key names its cell). A number is named by its shortest repr (`1e-05`, `0.0003`, `16`, a
`+` dropped), a boolean `true`/`false`, null `null`, a string by its characters with any outside
`[A-Za-z0-9_.-]` as `-`, a list or object by its position (`v1`, `v2`, ...).

A sweep adds its cells to the stage: to its `cells:` (a stage that declares none gets `cells:
{main: {}, <the sweep's>}`, so its `main` job is the one it was) and to its `select` (an empty
`select`, every cell, stays empty). The cells the config selects still run (a finished one is
not redone), which keeps a stage's other consumers (a perf baseline, gpt_train's `main`) planned.

Values are typed by the knob's schema (a `--config` value arrives as text: steps/config/coerce.py)
and each sweep cell is validated as the stage's cells are; an unknown stage or knob, an empty list,
or a value the knob does not take stops with one line naming the key and the fix. The stages that
write one shared output (the data stages, the report) cannot be swept.

Each sweep cell's job gets `sweep_of(config, stage, cell)` in its config (workflow/rules/common.smk):
its MLflow run (and its seeds' runs) are tagged `sweep=<key>`, `sweep_value=<value>` and
`sweep_order` (the value's rank), and the stage's experiment holds a saved view of the sweep
(steps/tracking/views.py: `sweep_view`). The report's `sweep` section: steps/report/sweep.py.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from steps.config.base import ConfigError, deep_merge
from steps.config.coerce import coerce_scalars

PREFIX = "sweep_"
# Stages whose rule writes one output for the whole DAG (no {cell} wildcard): one job, no sweep.
# tests/test_sweep.py checks this against the workflow's rules.
ONE_JOB = ("prepare_corpus", "train_tokenizer", "prepare_mcq", "report")
MATRIX_KEYS = ("cells", "select", "ladder")  # = steps.config.MATRIX_KEYS (that module imports this one)
FIX = "write it as '<stage>.<knob>' or '<stage>.cells.<cell>.<knob>', the knob's path in the config"


@dataclass(frozen=True)
class Sweep:
    """One key of the config's `sweep`: the stage, the knob's path in its section, the base cell (None:
    the stage's section, which declares no cells) and its cells [(name, value), ...] in value order."""

    key: str
    stage: str
    knob: tuple[str, ...]
    base: str | None
    named_base: bool
    cells: tuple[tuple[str, Any], ...]

    def tags(self, cell: str) -> dict[str, str]:
        """The MLflow tags of the cell's runs."""
        order = [c for c, _ in self.cells].index(cell)
        return {"sweep": self.key, "sweep_value": value_text(dict(self.cells)[cell]), "sweep_order": f"{order:03d}"}

    def as_dict(self) -> dict:
        """What the report job gets (workflow/rules/report.smk): JSON, in value order."""
        return {
            "sweep": self.key,
            "stage": self.stage,
            "knob": ".".join(self.knob),
            "base": self.base or "main",
            "cells": [[c, v] for c, v in self.cells],
        }


def value_text(value) -> str:
    """A value as its MLflow tag and the report show it: numbers by their shortest repr."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def value_name(value, position: int) -> str:
    """The value's part of its cell's name (module docstring): only [A-Za-z0-9_.-]."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value).replace("+", "")
    if isinstance(value, str):
        return re.sub(r"[^A-Za-z0-9_.\-]+", "-", value).strip("-") or f"v{position + 1}"
    return f"v{position + 1}"


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _split(key: str) -> tuple[str, str | None, tuple[str, ...]]:
    """(stage, named base cell or None, knob path) of a sweep key."""
    parts = key.split(".")
    stage = parts[0]
    if len(parts) >= 4 and parts[1] == "cells":
        return stage, parts[2], tuple(parts[3:])
    return stage, None, tuple(parts[1:])


def _base(config: dict, stage: str, named: str | None) -> str | None:
    """The sweep's base cell: the named one, else the stage's first selected cell (None: a stage
    without `cells:`, whose section is its one cell)."""
    if named is not None:
        return named
    section = config.get(stage) or {}
    if "cells" not in section:
        return None
    declared = list(section.get("cells") or {})
    select = section.get("select") or []
    chosen = [c for c in declared if not select or c in select]
    return chosen[0] if chosen else None


def sweeps(config: dict) -> list[Sweep]:
    """The config's sweeps as they stand (after validation: values typed, cells declared)."""
    out = []
    for key, values in (config.get("sweep") or {}).items():
        stage, named, knob = _split(key)
        base = _base(config, stage, named)
        prefix = PREFIX + (f"{named}." if named else "") + ".".join(knob) + "_"
        indexed = list(enumerate(values or []))
        if all(is_number(v) for _, v in indexed):
            indexed.sort(key=lambda iv: iv[1])  # value order: what the table and the plot read along
        cells = tuple((prefix + value_name(v, i), v) for i, v in indexed)
        out.append(Sweep(key, stage, knob, base, named is not None, cells))
    return out


def sweep_of(config: dict, stage: str, cell: str) -> dict[str, str] | None:
    """The MLflow tags of a sweep cell's runs (Sweep.tags); None for a cell of no sweep."""
    if not config.get("sweep") or not cell.startswith(PREFIX):
        return None
    for s in sweeps(config):
        if s.stage == stage and cell in dict(s.cells):
            return s.tags(cell)
    return None


def sweep_plan(config: dict) -> list[dict]:
    """Every sweep as the report reads it (Sweep.as_dict)."""
    return [s.as_dict() for s in sweeps(config)]


def _knob_schema(stage_schema: dict, knob: tuple[str, ...], key: str) -> dict:
    """The schema of the knob at `knob` in a stage's section; ConfigError naming the key where there is none."""
    schema, where = stage_schema, []
    for part in knob:
        props = {k: v for k, v in (schema.get("properties") or {}).items() if where or k not in MATRIX_KEYS}
        extra = schema.get("additionalProperties")
        if part in props:
            schema = props[part]
        elif isinstance(extra, dict):
            schema = extra
        else:
            known = ", ".join(sorted(props)) or "none: not an object"
            at = ".".join([key.split(".")[0], *where]) if where else key.split(".")[0]
            raise ConfigError(
                f"config key 'sweep.{key}': {at} has no knob {part!r} (its knobs: {known}); fix: name a knob of "
                f"workflow/schemas/{key.split('.')[0]}.schema.yaml, {FIX}"
            )
        where.append(part)
    return schema


def _nest(knob: tuple[str, ...], value) -> dict:
    out: Any = value
    for part in reversed(knob):
        out = {part: out}
    return out


def expand_sweep(cfg: dict, schema: dict, command_line: dict | None = None) -> dict:
    """`cfg` (validated, defaults filled) with every sweep's cells added to its stage (module
    docstring); its `sweep` values typed. `command_line`: the `--config` sweep entries, whose values
    arrive as text (typed as the knob's schema says, steps/config/coerce.py)."""
    from jsonschema import Draft7Validator

    from steps.config import _describe  # steps.config imports this module

    raw = cfg.get("sweep") or {}
    if not raw:
        return cfg
    stages = [s for s, sub in schema["properties"].items() if s not in ("tracking", "sweep") and "properties" in sub]
    typed = {}
    for key, values in raw.items():
        stage, named, knob = _split(key)
        if stage not in stages or stage in ONE_JOB:
            why = "writes one output for the whole DAG" if stage in ONE_JOB else "is not a stage"
            sweepable = ", ".join(s for s in stages if s not in ONE_JOB)
            raise ConfigError(f"config key 'sweep.{key}': {stage!r} {why}; fix: sweep a knob of {sweepable}; {FIX}")
        if not knob:
            raise ConfigError(f"config key 'sweep.{key}' names no knob of {stage}; fix: {FIX}")
        if named is not None and named not in (cfg[stage].get("cells") or {}):
            declared = list(cfg[stage].get("cells") or {})
            raise ConfigError(
                f"config key 'sweep.{key}' names the cell {named!r}, which {stage} does not declare "
                f"(declared: {declared}); fix: name a declared cell, or write '{stage}.{'.'.join(knob)}' "
                "to sweep the stage's first selected cell"
            )
        sub = _knob_schema(schema["properties"][stage], knob, key)
        if not isinstance(values, list) or not values:
            raise ConfigError(
                f"config key 'sweep.{key}' has no values ({values!r}); fix: give it a non-empty list, "
                f"e.g. sweep: {{{key}: [1, 2, 3]}}"
            )
        every_type = key in (command_line or {})
        typed[key] = [coerce_scalars(v, sub, every_type=every_type) for v in values]
    cfg["sweep"] = typed

    planned = sweeps(cfg)
    names: dict[tuple[str, str], str] = {}
    for s in planned:
        section = cfg[s.stage]
        stage_schema = schema["properties"][s.stage]
        cell_schema = {
            **stage_schema,
            "properties": {k: v for k, v in stage_schema.get("properties", {}).items() if k not in MATRIX_KEYS},
            "required": [],
        }
        base = ((section.get("cells") or {}).get(s.base) or {}) if s.base else {}
        plain = {k: v for k, v in section.items() if k not in MATRIX_KEYS}
        new = {}
        for cell, value in s.cells:
            if (s.stage, cell) in names:
                other = names[s.stage, cell]
                same = "the same value twice" if other == s.key else f"the same cell as sweep.{other}"
                raise ConfigError(
                    f"config key 'sweep.{s.key}': the value {value!r} makes the cell {cell!r}, {same}; "
                    "fix: give each value once (values that differ only in characters outside [A-Za-z0-9_.-] "
                    "name the same cell)"
                )
            names[s.stage, cell] = s.key
            over = deep_merge(base, _nest(s.knob, value))
            errors = sorted(
                Draft7Validator(cell_schema).iter_errors(deep_merge(plain, over)), key=lambda e: list(e.absolute_path)
            )
            if errors:
                raise ConfigError(
                    f"config key 'sweep.{s.key}': the value {value!r} does not fit {s.stage} "
                    f"({_describe(errors[0])}); fix: give values the knob takes, "
                    f"see workflow/schemas/{s.stage}.schema.yaml"
                )
            new[cell] = over
        declared = section.get("cells")
        clash = sorted(c for c in new if c in (declared or {}) and declared[c] != new[c])
        if clash:
            raise ConfigError(
                f"config key '{s.stage}.cells' declares {clash}, which sweep.{s.key} also makes: "
                "rename the hand-written cell"
            )
        select = list(section.get("select") or [])
        if select:
            section["select"] = select + [c for c in new if c not in select]
        section["cells"] = {**(declared if declared is not None else {"main": {}}), **new}
    return cfg
