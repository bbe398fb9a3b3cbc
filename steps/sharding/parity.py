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


# ---- fp32 tolerances from the fp64 run -----------------------------------------------------------
# A float32 cell's single-device reference is itself off the exact trajectory by its own rounding,
# which Adam amplifies where a gradient is near zero (lr·Δg/eps): on the MoE GPT, 3 Adam steps, one
# fp32 device misses the fp64 run by 1.7e-5 in transformer.h.0.mlp.experts.c_proj, more than a
# fixed 1e-5. Rank 0 also runs the reference in float64 from the same (fp32-rounded) weights; a
# tensor's tolerance is the larger of the plan's floor (1e-5) and ROUNDING_FACTOR × that tensor's
# one-device fp32 error |ref32 - ref64|max: if the sharded run is as close to the exact answer as
# one fp32 device is, |sharded - ref32| <= |sharded - exact| + |exact - ref32| <= 2·|ref32 - exact|
# (the fp64 run stands for the exact one: its own error is ~1e-14). float64 cells keep 1e-12.
ROUNDING_FACTOR = 2.0


def rounding_tolerances(ref: tuple, ref64: tuple, floor: float) -> dict:
    """Per-tensor tolerances {"loss": [per step], "grad": [per step {name: tol}], "param": {name: tol}}
    from the fp32 reference (losses, grads, params) and the same run in fp64."""

    def tol(a, b) -> float:
        return max(floor, ROUNDING_FACTOR * float(abs_diff(a, b).max()))

    losses, grads, params = ref
    return {
        "loss": [tol(a, b) for a, b in zip(losses, ref64[0])],
        "grad": [{k: tol(g[k], g64[k]) for k in g} for g, g64 in zip(grads, ref64[1])],
        "param": {k: tol(params[k], ref64[2][k]) for k in params},
    }


def over_tolerance(a: dict, b: dict, tols: dict | None, floor: float) -> tuple[float, float, float, str]:
    """The tensor whose |a - b|max is the largest share of its own tolerance (tols[name], else
    `floor`): (that share, its error, its tolerance, its name)."""
    _same_names(a, b)
    worst = (-1.0, 0.0, floor, "")
    for k in a:
        err = float(abs_diff(a[k], b[k]).max())
        t = (tols or {}).get(k, floor)
        if err / t > worst[0]:
            worst = (err / t, err, t, k)
    return worst


def worse(old: dict | None, ratio: float, err: float, tol: float, where: str) -> dict:
    """The record of a kind's worst share of its tolerance so far (a rank's `over` entry)."""
    new = {"ratio": ratio, "err": err, "tol": tol, "where": where}
    return new if old is None or ratio > old["ratio"] else old


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


def _share(r: dict, kind: str, key: str, tolerance: float) -> dict:
    """A rank's worst error of one kind as a share of its tolerance: the rank's own per-tensor
    record (`over`, fp32 torch cells: rounding_tolerances) where it has one, else the largest
    error against the plan's tolerance."""
    if kind in r.get("over", {}):
        return r["over"][kind]
    err = _worst(r.get(key, 0.0))
    return {"ratio": err / tolerance, "err": err, "tol": tolerance, "where": r.get(WHERE.get(kind, ""), "")}


def verdict(ranks: list[dict], tolerance: float) -> dict:
    """The cell's parity from every rank's record: the largest loss, gradient and parameter error
    over all ranks, the largest spread between replicas, a JAX cell's torch↔JAX error, and the
    worst of these as a share of its tolerance (`parity_err_over_tol`; `parity_err_worst` is that
    error, `parity_tol` its tolerance: the plan's, or the tensor's own in an fp32 torch cell; which
    kind it was, on which rank and tensor)."""
    per = {kind: [_worst(r.get(key, 0.0)) for r in ranks] for kind, key in KINDS.items()}
    share = {kind: [_share(r, kind, key, tolerance) for r in ranks] for kind, key in KINDS.items()}
    worst_of = max(share, key=lambda kind: max(s["ratio"] for s in share[kind]))
    rank = max(range(len(ranks)), key=lambda i: share[worst_of][i]["ratio"])
    w = share[worst_of][rank]
    return {
        "parity_max_dloss": max(per["loss"]),
        "parity_max_dgrad": max(per["grad"]),
        "parity_max_dparam": max(per["param"]),
        "parity_replica_spread": max(per["replicas"]),
        "parity_worst_of": worst_of,
        "parity_worst_rank": ranks[rank].get("rank", rank),
        "parity_worst_where": w["where"],
        "parity_err_worst": w["err"],
        "parity_tol": w["tol"],
        "parity_err_over_tol": w["ratio"],  # cells of different precisions compare by this
        "parity_ok": float(w["ratio"] <= 1),
        **({"parity_xbackend": max(per["xbackend"])} if any(KINDS["xbackend"] in r for r in ranks) else {}),
    }


def failure_message(v: dict) -> str:
    """Why a cell failed parity, with every number a reader needs."""
    where = f" ({v['parity_worst_where']})" if v["parity_worst_where"] else ""
    return (
        f"parity failed: {v['parity_worst_of']} error {v['parity_err_worst']:.2e} > tolerance "
        f"{v['parity_tol']:.2g} on rank {v['parity_worst_rank']}{where}; max |Δloss| {v['parity_max_dloss']:.2e}, "
        f"|Δgrad| {v['parity_max_dgrad']:.2e}, |Δparam| {v['parity_max_dparam']:.2e}, "
        f"replica spread {v['parity_replica_spread']:.2e}"
        + (f", torch↔JAX {v['parity_xbackend']:.2e}" if "parity_xbackend" in v else "")
        + " (every rank vs one device, the ranks vs each other, a JAX cell vs torch)"
    )
