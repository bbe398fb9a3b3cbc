"""Config loading and validation shared by the Snakefile, the stage modules and the tests.

The schema is split per stage (`workflow/schemas/<section>.schema.yaml`) so each stage owns its
keys; `config.schema.yaml` holds the top-level keys. Validation fills defaults, rejects unknown
keys and wrong types *before any job starts*, and names the key and the expected type.
`perf.ladder` expands into perf cells here (`steps/config/ladder.py`), before validation of the cells.
A `sweep` expands into cells of its stage here too (`steps/config/sweep.py`).
Strings a reader left untyped (YAML's `1e-4`, a nested `--config`'s values) are typed by the schema
first (`steps/config/coerce.py`); every `select` and cell reference must name a declared cell.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator, validators

from steps.config.base import ConfigError, deep_merge
from steps.config.coerce import coerce_scalars
from steps.config.ladder import expand_ladder
from steps.config.sweep import expand_sweep

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "workflow" / "schemas"
CONFIG_DIR = ROOT / "configs"


# Keys that describe a stage's matrix, not one job: never part of a cell's resolved config.
MATRIX_KEYS = ("cells", "select", "ladder")
# Top-level keys that say where finished jobs are kept, not what a job computes (the run cache,
# steps/core/runcache.py): in no job's config, so changing them reruns nothing and changes no hash.
RUN_CACHE_KEYS = ("cache", "cache_dir")
# Keys whose value names cells of a stage ({stage: {key: the stage whose cells it names}}): the DAG
# plans those cells' jobs as inputs (rules/perf.smk, rules/scale.smk).
CELL_REFERENCES = {
    "perf": {"baseline_cell": "perf"},
    "scale": {"measured": "sharding"},
    "gpt_train": {"init_from": "gpt_train"},
}
# Keys renamed since: the error names the new key and how its values map.
RENAMED = {
    "gpt_train.dtype": "renamed to gpt_train.amp, the precision's name in every stage "
    "(float32 -> none, bfloat16 -> bf16, float16 -> fp16)",
}


def _extend_with_default(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": set_defaults})


_FillingValidator = _extend_with_default(Draft7Validator)


def load_schema() -> dict:
    """Assemble the full schema: top level + one section per `<section>.schema.yaml`."""
    top = yaml.safe_load((SCHEMA_DIR / "config.schema.yaml").read_text())
    for path in sorted(SCHEMA_DIR.glob("*.schema.yaml")):
        section = path.name.removesuffix(".schema.yaml")
        if section == "config":
            continue
        sub = yaml.safe_load(path.read_text())
        sub.setdefault("default", {})
        top["properties"][section] = sub
    return top


def stage_schema(stage: str) -> dict:
    return load_schema()["properties"][stage]


def _describe(error) -> str:
    key = ".".join(str(p) for p in error.absolute_path) or "<top level>"
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        where = f"{key}." if key != "<top level>" else ""
        name = f"{where}{extra[0] if extra else '?'}"
        if name in RENAMED:
            return f"config key '{name}' was {RENAMED[name]}"
        return f"config key '{name}' is unknown (allowed here: {allowed})"
    if error.validator == "type":
        return (
            f"config key '{key}' must be of type {error.validator_value}, "
            f"got {type(error.instance).__name__} {error.instance!r}"
        )
    if error.validator == "enum":
        return f"config key '{key}' must be one of {error.validator_value}, got {error.instance!r}"
    if error.validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        return f"config key '{key}' must satisfy {error.validator} {error.validator_value}, got {error.instance!r}"
    return f"config key '{key}': {error.message}"


def _validate(instance: dict, schema: dict, where: str, fill: bool) -> None:
    cls = _FillingValidator if fill else Draft7Validator
    errors = sorted(cls(schema).iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        lines = "\n  ".join(_describe(e) for e in errors[:10])
        raise ConfigError(
            f"invalid config ({where}):\n  {lines}\n"
            f"Fix the key in your --configfile/--config, or see workflow/schemas/."
        )


def validate_config(config: dict, where: str = "merged config", command_line: dict | None = None) -> dict:
    """Fill defaults and validate; then validate every matrix cell merged onto its stage.
    `command_line`: the `--config` values as Snakemake parsed them (nested scalars all strings),
    typed by the schema (steps/config/coerce.py) and laid over `config`, which holds them untyped."""
    schema = load_schema()
    cfg = coerce_scalars(copy.deepcopy(config), schema)
    if command_line:
        cfg = deep_merge(cfg, coerce_scalars(command_line, schema, every_type=True))
    _validate(cfg, schema, where, fill=True)
    if isinstance(cfg.get("perf"), dict):
        cfg["perf"] = expand_ladder(cfg["perf"])
    # `sweep`: one knob over values, each a cell of its stage (steps/config/sweep.py), validated below
    cfg = expand_sweep(cfg, schema, (command_line or {}).get("sweep"))
    for stage, sub in schema["properties"].items():
        section = cfg.get(stage)
        if not isinstance(section, dict) or "cells" not in section:
            continue
        plain = {k: v for k, v in sub.get("properties", {}).items() if k not in MATRIX_KEYS}
        cell_schema = {**sub, "properties": plain, "required": []}
        for cell, over in section["cells"].items():
            merged = deep_merge({k: v for k, v in section.items() if k not in MATRIX_KEYS}, over or {})
            _validate(merged, cell_schema, f"{where}, {stage}.cells.{cell}", fill=True)
            # a cell's own keys as resolved: a partial nested object (`lora: {r: 4}` where the stage's
            # `lora` is null) gets the schema's defaults for the keys it leaves out
            section["cells"][cell] = {k: merged[k] for k in over or {}}
    check_cell_names(cfg)
    return cfg


def load_config(*paths: str | Path, overrides: dict | None = None) -> dict:
    """Load YAML files in order (later wins), apply overrides, validate."""
    cfg: dict = {}
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        cfg = deep_merge(cfg, yaml.safe_load(p.read_text()) or {})
    return validate_config(deep_merge(cfg, overrides or {}), where=", ".join(map(str, paths)))


def declared_cells(config: dict, stage: str) -> list[str]:
    """All cells a matrix stage declares (a single 'main' cell for a plain stage)."""
    section = config.get(stage, {})
    return list(section.get("cells") or {}) if "cells" in section else ["main"]


def cells(config: dict, stage: str) -> list[str]:
    """The cells to run: `<stage>.select` narrows the declared matrix (empty = all)."""
    declared = declared_cells(config, stage)
    select = config.get(stage, {}).get("select") or []
    unknown = [c for c in select if c not in declared]
    if unknown:
        raise ConfigError(
            f"config key '{stage}.select' names unknown cells {unknown}; declared: {declared}. "
            f"Fix: select declared cells, or declare them under {stage}.cells"
        )
    return [c for c in declared if not select or c in select]


def check_cell_names(config: dict) -> None:
    """Every cell the DAG plans must be declared. Checked with the config, before any job: an
    unknown `select` entry or a cell reference (CELL_REFERENCES) otherwise surfaces in the middle of
    planning, as Snakemake's InputFunctionException with a traceback."""
    for stage, section in config.items():
        if not isinstance(section, dict) or "cells" not in section:
            continue
        planned = cells(config, stage)
        for key, target in CELL_REFERENCES.get(stage, {}).items():
            declared = declared_cells(config, target)
            for cell in planned:
                value = cell_config(config, stage, cell)["params"].get(key)
                unknown = [n for n in ([value] if isinstance(value, str) else value or []) if n not in declared]
                if unknown:
                    raise ConfigError(
                        f"config key '{stage}.{key}' of cell {cell!r} names unknown {target} cells {unknown}; "
                        f"declared: {declared}. Fix: name declared cells, or declare them under {target}.cells"
                    )


def cell_config(config: dict, stage: str, cell: str) -> dict:
    """The resolved config one job sees: stage section merged with its cell, plus top-level keys."""
    section = config.get(stage, {})
    resolved = {k: v for k, v in section.items() if k not in MATRIX_KEYS}
    if "cells" in section:
        if cell not in section["cells"]:
            raise ConfigError(f"{stage}: no cell named {cell!r}; declared: {sorted(section['cells'])}")
        resolved = deep_merge(resolved, section["cells"][cell] or {})
    common = {
        k: v for k, v in config.items() if (not isinstance(v, dict) or k in ("tracking",)) and k not in RUN_CACHE_KEYS
    }
    return {"stage": stage, "cell": cell, "common": common, **{"params": resolved}}


def config_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
