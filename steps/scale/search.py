"""The best plan that fits: for a model, a global batch (sequences) and a cluster of `world` GPUs,
every mesh pp × data × tp (tp ≤ a node, dividing the heads and KV heads; pp dividing the layers)
with each ZeRO stage of the data axis and each activation-checkpointing mode, ranked by predicted
tokens/s per GPU among those whose memory fits (steptime.predict)."""

from __future__ import annotations

from steps.models.shapes import Shape
from steps.scale.cluster import Cluster
from steps.scale.scale_plan import AC, ScalePlan
from steps.scale.steptime import predict


def candidates(shape: Shape, cluster: Cluster, world: int, global_batch: int, seq: int):
    for tp in (1, 2, 4, 8):
        if tp > cluster.gpus_per_node or shape.heads % tp or shape.kv_heads % tp or world % tp:
            continue
        for pp in (1, 2, 4, 8, 16):
            if shape.layers % pp or world % (tp * pp):
                continue
            data = world // (tp * pp)
            if global_batch % data:
                continue
            local = global_batch // data
            for zero in (0, 1, 2, 3):
                axis = "fsdp" if zero == 3 else "dp"
                mesh = {"pp": pp, axis: data, "tp": tp}
                for ac in AC:
                    yield ScalePlan.from_params(
                        {"mesh": mesh, "zero": zero if axis == "dp" else -1, "ac": ac, "local_batch": local,
                         "seq": seq, "microbatches": local if pp > 1 else 1}
                    )  # fmt: skip


def best_plan(shape: Shape, cluster: Cluster, world: int, global_batch: int, seq: int):
    """(plan, prediction) of the fastest plan that fits, or (None, the closest miss) if none does."""
    rows = [(p, predict(shape, p, cluster)) for p in candidates(shape, cluster, world, global_batch, seq)]
    if not rows:
        raise ValueError(f"no mesh of {world} GPUs divides global batch {global_batch} for {shape.name}")
    fits = [r for r in rows if r[1]["fits"]]
    if fits:
        return max(fits, key=lambda r: r[1]["tokens_per_s_gpu"]), len(rows), len(fits)
    return (None, min(rows, key=lambda r: r[1]["mem_total"])[1]), len(rows), 0
