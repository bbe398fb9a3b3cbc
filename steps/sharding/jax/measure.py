"""What a JAX cell measures: the collectives in the compiled HLO (every all-reduce / all-gather /
reduce-scatter / collective-permute / all-to-all, its shape and replica-group size) in
steps/analytic/comm.py's ring convention, the bytes each device holds, and where each slice lives."""

from __future__ import annotations

import re

import jax
import numpy as np

from steps.analytic.comm import ring_bytes

_DT = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s64": 8, "pred": 1}
_COLL = re.compile(
    r"=\s*(\(.*?\)|\w+\[[\d,]*\](?:\{[^}]*\})?)\s+(all-reduce|all-gather|reduce-scatter|"
    r"collective-permute|all-to-all)(?:-start)?\("
)
_RING_OP = {
    "all-reduce": "all_reduce",
    "all-gather": "all_gather",
    "reduce-scatter": "reduce_scatter",
    "collective-permute": "send",
    "all-to-all": "all_to_all",
}


def _shape_bytes(text: str) -> int:
    return sum(
        _DT.get(dt, 4) * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
        for dt, dims in re.findall(r"(\w+)\[([\d,]*)\]", text)
    )


def _group_size(line: str, world: int) -> int:
    m = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)  # iota form: [groups, size]<=[N]
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)  # mesh['a'=2,'b'=2] {'a'}
    if m:
        sizes = {k: int(v) for k, v in re.findall(r"'(\w+)'=(\d+)", m.group(1))}
        return int(np.prod([sizes[a] for a in re.findall(r"'(\w+)'", m.group(2))] or [1]))
    return world


def hlo_comm(hlo: str, world: int) -> tuple[float, dict]:
    """Ring-equivalent bytes per device of every collective in compiled HLO."""
    total, calls = 0.0, {}
    for line in hlo.splitlines():
        m = _COLL.search(line)
        if not m or "-done" in line:
            continue
        out, op = _shape_bytes(m.group(1)), m.group(2)
        n = _group_size(line, world)
        charged = out * n if op == "reduce-scatter" else out  # a reduce-scatter consumes N× its output
        total += ring_bytes(_RING_OP[op], charged, n)
        calls[op] = calls.get(op, 0) + 1
    return total, calls


def per_device_bytes(tree) -> dict:
    out: dict = {}
    for a in jax.tree.leaves(tree):
        for s in a.addressable_shards:
            out[s.device.id] = out.get(s.device.id, 0) + s.data.nbytes
    return out


def render_sharding(params: dict, mesh) -> str:
    """Which slice of each array lives on which device (jax.debug.visualize_array_sharding in text)."""
    lines = [f"mesh {dict(mesh.shape)}  devices {mesh.devices.tolist()}"]
    for k, a in params.items():
        lines.append(f"\n{k} shape {a.shape} spec {a.sharding.spec}")
        for dev, idx in sorted(a.sharding.devices_indices_map(a.shape).items(), key=lambda t: t[0].id):
            sl = ", ".join(f"{s.start or 0}:{s.stop if s.stop is not None else n}" for s, n in zip(idx, a.shape))
            lines.append(f"  device {dev.id}: [{sl}]")
    return "\n".join(lines) + "\n"
