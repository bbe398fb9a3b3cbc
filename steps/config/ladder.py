"""The perf ladder: the modern GPT-2 training ladder (fp32 -> TF32 -> bf16 -> compile -> flash
attention -> padded vocabulary -> fused AdamW -> ...) expanded from config into matrix cells,
each step both as a single change from the shape's baseline and cumulatively on top of every
step before it (Karpathy's single-GPU ladder: 1000 ms -> 90 ms a step on an A100).

    perf:
      ladder:
        base: {attn: manual, adamw: default}              # the ladder's fp32 eager baseline
        shapes:                                           # one table per shape
          t1024: {batch_size: 16, model: {block_size: 1024}}
        steps:
          - {name: tf32, desc: "TF32 tensor cores", change: {tf32: true}}
          - {name: bf16, desc: "bf16 autocast", change: {amp: bf16}}
          - {name: fp8, desc: "fp8 matmuls", change: {model: {fp8: true}}, single: false}

expands into the cells t1024_baseline, t1024_tf32 (single), t1024_bf16 (single),
t1024_ladder_bf16 (= tf32 + bf16), t1024_ladder_fp8 (= tf32 + bf16 + fp8; `single: false`
makes no single cell). Step 1's cumulative cell is its single cell. Every generated cell has
baseline_cell = its shape's baseline, so "× baseline" and the loss drift compare within a shape.
Cells declared by hand in `perf.cells` stay as they are; a generated name may not clash.
"""

from __future__ import annotations

from steps.config.base import ConfigError, deep_merge


def ladder_cells(ladder: dict) -> dict[str, dict]:
    """{cell name: its overrides of the perf section} for every shape × step."""
    out: dict[str, dict] = {}
    for shape, shape_over in (ladder.get("shapes") or {}).items():
        base_name = f"{shape}_baseline"
        common = deep_merge(deep_merge(ladder.get("base") or {}, shape_over or {}), {"baseline_cell": base_name})
        out[base_name] = deep_merge(common, {"desc": f"{shape}: baseline (ladder step 0)"})
        cumulative = common
        for i, step in enumerate(ladder.get("steps") or []):
            name, change = step["name"], step.get("change") or {}
            cumulative = deep_merge(cumulative, change)
            desc = step.get("desc", name)
            if step.get("single", True):
                out[f"{shape}_{name}"] = deep_merge(
                    deep_merge(common, change), {"desc": f"{shape}: {desc} (single change)"}
                )
            if i > 0 or not step.get("single", True):
                out[f"{shape}_ladder_{name}"] = deep_merge(
                    cumulative, {"desc": f"{shape}: ladder step {i + 1}, + {desc}"}
                )
    return out


def expand_ladder(section: dict) -> dict:
    """The perf section with its ladder's cells added to `cells` (in ladder order, after the
    hand-written cells)."""
    generated = ladder_cells(section.get("ladder") or {})
    declared = section.get("cells") or {}
    clash = sorted(c for c in set(generated) & set(declared) if declared[c] != generated[c])  # re-validation is fine
    if clash:
        raise ConfigError(
            f"config key 'perf.cells' declares {clash}, which perf.ladder also generates: "
            "rename the hand-written cell or the ladder shape/step"
        )
    if not generated:
        return section
    return {**section, "cells": {**(section.get("cells") or {}), **generated}}
