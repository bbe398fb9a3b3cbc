"""The step-time model: compute, the communication compute cannot hide, the pipeline bubble.

compute   executed FLOPs ÷ (mfu × peak): model FLOPs (shapes.flops_per_token) plus what
          activation checkpointing recomputes (full: the forward again, 2N + 4·L·d·T per token;
          selective, torchtitan's op SAC: every second forward matmul, N_layers per token)
overlap   FSDP's all-gathers / reduce-scatters and DP's (HSDP's, ZeRO-1/2's) gradient
          collectives run beside compute (prefetch, bucketed backward): only what exceeds the
          compute window shows, plus one layer's worth that cannot overlap (the first all-gather,
          the last reduce-scatter or bucket). TP's all-reduces sit between dependent matmuls: all
          exposed (async TP not modelled). PP's sends are exposed; the bubble adds (p-1)/(v·m)
          of the compute.
          EP's all-to-alls (dispatch, combine: the router's output decides them, the experts wait for
          them) are all exposed, as torchtitan runs them without overlap
tokens/s per GPU = global tokens per step ÷ step time ÷ world; MFU = model FLOPs/s ÷ peak
memory per GPU   = the state the torch implementation holds (analytic.held_state: fp32 gradients,
          as communicated) + saved activations + transient buffers (FSDP: two layers' bf16
          parameters gathered and one layer's fp32 gradients before their reduce-scatter; ZeRO-2:
          that layer's fp32 gradients; the cross-entropy's fp32 logits gradient)
"""

from __future__ import annotations

from steps.analytic.activations import activations
from steps.analytic.comm import by_collective
from steps.analytic.memory import BF16, FP32, GRAD_REDUCE, held_state
from steps.models.shapes import Shape
from steps.scale.cluster import Cluster
from steps.scale.scale_plan import ScalePlan

OVERLAPPED = ("fsdp", "dp", "dp_shard", "ep")  # axes whose collectives run beside compute (all-to-alls: never)


def executed_flops_per_token(shape: Shape, plan: ScalePlan) -> float:
    model = shape.flops_per_token(plan.seq)
    n_layers = shape.groups()["layers"]
    if plan.ac == "full":  # the forward again: a third of 6N + 12·L·d·T
        return model * 4 / 3
    if plan.ac == "selective":
        return model + n_layers
    return model


def calls(shape: Shape, plan: ScalePlan, key: str) -> int:
    """How many collectives make up a `comm` entry (each pays its latency)."""
    L = shape.layers // plan.axis("pp")
    axis, op = key.split("/")
    if op == "all_to_all":  # EP: dispatch and combine, forward and backward, and the row counts, per layer
        return 5 * L
    if axis in ("dp_shard", "ep", "fsdp") and op == "all_reduce":  # EP: the load-balancing statistics
        return 2 * L
    if axis in ("fsdp", "dp_shard", "ep"):
        return 2 * L + 1 if op == "all_gather" else L + 1
    if axis == "dp":
        return L + 1  # one bucket per layer
    if axis == "tp":  # SP: the norms' gradient all-reduces, one per layer
        return (L if plan.sp and op == "all_reduce" else 4 * L + 2) * plan.microbatches
    return 2 * plan.microbatches


def predict(shape: Shape, plan: ScalePlan, cluster: Cluster) -> dict:
    world = plan.world
    tokens = plan.global_batch * plan.seq
    compute = executed_flops_per_token(shape, plan) * tokens / world / (cluster.mfu * cluster.peak_flops)
    comm = by_collective(shape, plan)
    times: dict[str, float] = {}
    for key, nbytes in comm.items():
        axis, op = key.split("/")
        n = plan.group_size(axis)
        t = cluster.collective_time(op, nbytes, n, cluster.link(plan, axis), calls(shape, plan, key))
        bucket = "all_to_all" if op == "all_to_all" else axis  # EP's all-to-alls sit between the router and the experts
        times[bucket] = times.get(bucket, 0.0) + t
    L = shape.layers / plan.axis("pp")
    exposed = 0.0
    for axis in OVERLAPPED:
        t = times.get(axis, 0.0)
        exposed += max(0.0, t - compute) + t / (L + 1)
    exposed += times.get("tp", 0.0) + times.get("pp", 0.0) + times.get("all_to_all", 0.0)
    p, v, m = plan.axis("pp"), plan.interleave, plan.microbatches
    bubble = (p - 1) / (v * m) if p > 1 else 0.0
    step = compute * (1 + bubble) + exposed
    tps = tokens / step / world
    mem = memory(shape, plan)
    return {
        "step_s": step,
        "compute_s": compute,
        "exposed_comm_s": exposed,
        "comm_s": sum(times.values()),
        "bubble": bubble,
        "tokens_per_s_gpu": tps,
        "mfu": shape.flops_per_token(plan.seq) * tps / cluster.peak_flops,
        "comm_bytes": sum(comm.values()),
        "all_to_all_s": times.get("all_to_all", 0.0),
        **{f"mem_{k}": v for k, v in mem.items()},
        "fits": float(mem["total"] <= cluster.memory_bytes),
    }


def memory(shape: Shape, plan: ScalePlan) -> dict[str, float]:
    st = held_state(shape, plan)
    act = activations(shape, plan)
    t = plan.axis("tp")
    layer = (shape.groups()["layers"] / shape.layers - shape.layer_replicated()) / t + shape.layer_replicated()
    layer -= shape.expert_params() / shape.layers * (1 - 1 / plan.axis("ep"))  # EP: a layer gathers its E/ep experts
    fsdp = {3: 2 * BF16 + GRAD_REDUCE, 2: GRAD_REDUCE}.get(plan.zero_stage, 0.0) * layer
    ce = FP32 * plan.micro_batch * plan.seq * shape.vocab / (t if shape.family == "llama" else 1)
    out = {"state": st["state"], "activations": act["saved"], "transient": fsdp + ce}
    out["total"] = sum(out.values())
    return out
