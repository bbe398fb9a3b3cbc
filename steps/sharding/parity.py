"""The one parity check every engine uses: the largest |sharded - single device| over a state,
on every replica, and the largest spread between replicas of the same tensor.

Works on torch tensors and on numpy/JAX arrays without importing either framework (a JAX process
stays torch-free). Torch tensors are compared in float64 on the CPU: a gathered pipeline state is
on the CPU (comm.gather_state) while the reference may be on a GPU under NCCL.

Torch cells: every rank compares its own view of the state (its replica, or the shards it gathers)
with the reference, and the ranks' views are compared with each other (worker.py). JAX cells hold
every device in one process: `max_delta_shards` compares each addressable shard (each copy of a
replicated array is its own shard) with the matching slice of the reference.
"""

from __future__ import annotations

import numpy as np

# the errors a cell's parity verdict takes the worst of, and the rank-record key of each; xbackend:
# a JAX cell's losses and final parameters against torch's single-device run (jax/engine.py), an
# independent implementation, at the same tolerance (absent, as in torch cells: 0)
KINDS = {"loss": "dloss", "grad": "dgrad", "param": "dparam", "replicas": "replica_spread", "xbackend": "xb_err"}
WHERE = {"grad": "dgrad_where", "param": "dparam_where", "replicas": "replica_where", "xbackend": "xb_where"}


def host_f64(t):
    """`t` in float64 on the host: a CPU torch tensor, or a numpy array for anything else."""
    if hasattr(t, "detach"):  # torch
        return t.detach().double().cpu()
    return np.asarray(t, np.float64)


def abs_diff(a, b):
    """|a - b| in float64 on the host."""
    return abs(host_f64(a) - host_f64(b))


def _same_names(a: dict, b: dict) -> None:
    if set(a) != set(b):
        raise RuntimeError(
            f"parity: names differ between sharded and reference state: only sharded "
            f"{sorted(set(a) - set(b))[:4]}, only reference {sorted(set(b) - set(a))[:4]}"
        )


def max_delta(a: dict, b: dict) -> tuple[float, str]:
    """Largest |a - b| over all tensors of two {name: tensor} states, and the name it is in."""
    _same_names(a, b)
    return max((float(abs_diff(a[k], b[k]).max()), k) for k in a)


def replica_spread(states: list[dict]) -> tuple[float, str]:
    """Largest |state_r - state_0| over the ranks' views of one state (0 for a single view)."""
    return max([max_delta(s, states[0]) for s in states[1:]], default=(0.0, ""))


def _larger(best: tuple[float, str], err: float, where: str) -> tuple[float, str]:
    """(err, where) if err beats best (the first place wins a tie)."""
    return (err, where) if err > best[0] or not best[1] else best


def max_delta_shards(a: dict, ref: dict) -> tuple[float, str, tuple[float, str]]:
    """Every addressable shard of every JAX array in `a` against the matching slice of `ref`
    (numpy): (largest error, "name@device d", (largest spread between copies of one slice, where))."""
    _same_names(a, ref)
    worst, spread = (0.0, ""), (0.0, "")
    for k, arr in a.items():
        full = np.asarray(ref[k], np.float64)
        copies: dict[str, np.ndarray] = {}
        for s in arr.addressable_shards:
            data = np.asarray(s.data, np.float64)
            if not data.size:
                continue
            first = copies.setdefault(str(s.index), data)
            here = f"{k}@device {s.device.id}"
            worst = _larger(worst, float(np.abs(data - full[s.index]).max()), here)
            spread = _larger(spread, float(np.abs(data - first).max()), here)
    return worst[0], worst[1], spread


def _worst(value) -> float:
    return max(value) if isinstance(value, list) else float(value)


def verdict(ranks: list[dict], tolerance: float) -> dict:
    """The cell's parity from every rank's record: the largest loss, gradient and parameter error
    over all ranks, the largest spread between replicas, a JAX cell's torch↔JAX error, and the
    worst of these (`parity_err_worst`, which one it was, on which rank and tensor) against the
    tolerance."""
    per = {kind: [_worst(r.get(key, 0.0)) for r in ranks] for kind, key in KINDS.items()}
    worst_of = max(per, key=lambda kind: max(per[kind]))
    rank = max(range(len(ranks)), key=lambda i: per[worst_of][i])
    where = WHERE.get(worst_of)
    err = max(per[worst_of])
    return {
        "parity_max_dloss": max(per["loss"]),
        "parity_max_dgrad": max(per["grad"]),
        "parity_max_dparam": max(per["param"]),
        "parity_replica_spread": max(per["replicas"]),
        "parity_err_worst": err,
        "parity_worst_of": worst_of,
        "parity_worst_rank": ranks[rank].get("rank", rank),
        "parity_worst_where": ranks[rank].get(where, "") if where else "",
        "parity_tol": tolerance,
        "parity_err_over_tol": err / tolerance,  # cells of different precisions compare by this
        "parity_ok": float(err <= tolerance),
        **({"parity_xbackend": max(per["xbackend"])} if any(KINDS["xbackend"] in r for r in ranks) else {}),
    }


def failure_message(v: dict) -> str:
    """Why a cell failed parity, with every number a reader needs."""
    where = f" ({v['parity_worst_where']})" if v["parity_worst_where"] else ""
    return (
        f"parity failed: {v['parity_worst_of']} error {v['parity_err_worst']:.2e} > tolerance "
        f"{v['parity_tol']:.0e} on rank {v['parity_worst_rank']}{where}; max |Δloss| {v['parity_max_dloss']:.2e}, "
        f"|Δgrad| {v['parity_max_dgrad']:.2e}, |Δparam| {v['parity_max_dparam']:.2e}, "
        f"replica spread {v['parity_replica_spread']:.2e}"
        + (f", torch↔JAX {v['parity_xbackend']:.2e}" if "parity_xbackend" in v else "")
        + " (every rank vs one device, the ranks vs each other, a JAX cell vs torch)"
    )
