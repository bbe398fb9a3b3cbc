"""Scalars typed as the schema says, before validation.

Two readers hand the lab strings where the user wrote a number or a boolean:
- YAML 1.1 reads `1e-4` (no dot) as a string;
- Snakemake parses a nested `--config 'gpt_train={"max_steps": 10, "compile": true}'` with YAML's
  BaseLoader (snakemake/cli.py `parse_config`), which leaves every scalar inside a string.
Where the schema asks for an integer, number, boolean or null and the string spells one, it becomes
one; any other string stays a string, so validation still rejects it naming the key path.
Cell overrides (`<stage>.cells.<cell>`) and a ladder's parts (`perf.ladder`: base, shapes, steps'
changes; steps/config/ladder.py) are coerced with their stage's property schemas.
"""

from __future__ import annotations

import re

_INT = re.compile(r"[-+]?[0-9]+")
_TRUE, _FALSE = {"true", "yes", "on"}, {"false", "no", "off"}  # YAML 1.1 (PyYAML SafeLoader)
_NULL = {"null", "~"}


def _types(schema: dict) -> set[str]:
    t = schema.get("type")
    return set(t) if isinstance(t, list) else {t} if isinstance(t, str) else set()


def coerce_text(text: str, schema: dict):
    """One string as the schema's scalar type; unchanged when it spells none of them."""
    types, word = _types(schema), text.strip().lower()
    if "null" in types and word in _NULL:
        return None
    if "string" in types:
        return text
    if types & {"integer", "number"} and _INT.fullmatch(text.strip()):
        return int(text)  # as YAML reads `10` from a file (a number schema accepts an int)
    if "number" in types:
        try:
            return float(text)
        except ValueError:
            return text
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


def coerce_scalars(instance, schema: dict):
    """`instance` with every string the schema types as a scalar converted (a new object)."""
    if isinstance(instance, str):
        return coerce_text(instance, schema)
    if isinstance(instance, dict):
        out = {}
        for k, v in instance.items():
            if k == "cells" and isinstance(v, dict):
                out[k] = {c: coerce_scalars(o, schema) if isinstance(o, dict) else o for c, o in v.items()}
            elif k == "ladder" and isinstance(v, dict):
                out[k] = coerce_scalars(v, _ladder_schema(schema))
            elif (sub := _child_schema(schema, k)) is not None:
                out[k] = coerce_scalars(v, sub)
            else:
                out[k] = v
        return out
    if isinstance(instance, list) and isinstance(schema.get("items"), dict):
        return [coerce_scalars(v, schema["items"]) for v in instance]
    return instance
