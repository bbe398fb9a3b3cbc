"""What every config module shares: the config error and the merge of a cell onto its section."""

from __future__ import annotations

import copy

__all__ = ["ConfigError", "deep_merge"]


class ConfigError(ValueError):
    """A config problem, phrased for the person who wrote the YAML."""


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
