"""Scalars typed as the schema says, before validation, where a reader lost their type:

- YAML 1.1 reads `1e-4` (no dot) as a string: in every config, a string where the schema says
  number becomes one (`coerce_scalars(config, schema)`);
- Snakemake parses a nested `--config 'gpt_train={"max_steps": 10, "compile": true}'` with YAML's
  BaseLoader (snakemake/cli.py `parse_config`), which leaves every scalar inside a string: in the
  command line's values only, a string that spells the integer, number, boolean or null the schema
  asks for becomes one (`every_type=True`). A YAML file keeps its types: a quoted "16" stays a string.
Any other string stays a string, so validation still rejects it naming the key path. Cell overrides
(`<stage>.cells.<cell>`) and a ladder's parts (`perf.ladder`: base, shapes, steps' changes;
steps/config/ladder.py) are coerced with their stage's property schemas.
"""

from __future__ import annotations

import re

_INT = re.compile(r"[-+]?[0-9]+")
_TRUE, _FALSE = {"true", "yes", "on"}, {"false", "no", "off"}  # YAML 1.1 (PyYAML SafeLoader)
_NULL = {"null", "~"}


def _types(schema: dict) -> set[str]:
    t = schema.get("type")
    return set(t) if isinstance(t, list) else {t} if isinstance(t, str) else set()


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def coerce_text(text: str, schema: dict, every_type: bool = False):
    """One string as the schema's scalar type; unchanged when it spells none of them (or, unless
    `every_type`, when the type is not a number)."""
    types, word = _types(schema), text.strip().lower()
    if not every_type:
        return _number(text) if "number" in types else text
    if "null" in types and word in _NULL:
        return None
    if "string" in types:
        return text
    if types & {"integer", "number"} and _INT.fullmatch(text.strip()):
        return int(text)  # as YAML reads `10` from a file (a number schema accepts an int)
    if "number" in types:
        return _number(text)
    if "boolean" in types and word in _TRUE | _FALSE:
        return word in _TRUE
    return text


def _child_schema(schema: dict, key: str) -> dict | None:
    """The schema of `key` inside an object schema: its property, else additionalProperties."""
    if key in schema.get("properties", {}):
        return schema["properties"][key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _ladder_schema(section: dict) -> dict:
    """A ladder's base, shapes and steps' changes override the section, so are typed as it is."""
    return {
        "properties": {
            "base": section,
            "shapes": {"additionalProperties": section},
            "steps": {"items": {"properties": {"change": section}}},
        }
    }


def coerce_scalars(instance, schema: dict, every_type: bool = False):
    """`instance` with the strings the schema types as scalars converted (coerce_text; a new object)."""
    if isinstance(instance, str):
        return coerce_text(instance, schema, every_type)
    if isinstance(instance, dict):
        out = {}
        for k, v in instance.items():
            if k == "cells" and isinstance(v, dict):
                out[k] = {c: coerce_scalars(o, schema, every_type) if isinstance(o, dict) else o for c, o in v.items()}
            elif k == "ladder" and isinstance(v, dict):
                out[k] = coerce_scalars(v, _ladder_schema(schema), every_type)
            elif (sub := _child_schema(schema, k)) is not None:
                out[k] = coerce_scalars(v, sub, every_type)
            else:
                out[k] = v
        return out
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [coerce_scalars(v, schema["items"], every_type) for v in instance]
    return instance
