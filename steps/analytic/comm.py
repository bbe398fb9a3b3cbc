"""Communication: ring-equivalent bytes one rank sends per step, for the sharding stage's plans
(our MLP and GPT on gloo, exact: measured ÷ these is 1) and the scale stage's (the Playbook's
accounting at bf16 compute with fp32 gradient reduction, on a named shape).

The ring convention ("ring-equivalent bytes sent per rank"), the one place its factors live: over
a group of N ranks an all-reduce of n bytes costs 2(N-1)/N·n (a reduce-scatter then an
all-gather), an all-gather producing n bytes and a reduce-scatter consuming n bytes cost
(N-1)/N·n, a point-to-point send of n bytes costs n. So DP moves 2Ψ·(N-1)/N·b per step and FSDP
3Ψ·(N-1)/N·b (all-gather forward, all-gather backward, reduce-scatter of the gradients).
steps/sharding/comm.py counts torch's collectives, steps/sharding/jax/measure.py the compiled HLO's
and steps/scale/fakeworld.py the fake process group's with these factors.

Ψ = parameter count (steps/analytic/params.py), b = bytes per element, N = size of the axis that
shards or replicates.

Scale (by_collective): DP all-reduces fp32 gradients (2Ψ·4); ZeRO-1/2 reduce-scatter them and
all-gather bf16 parameters (the same 2Ψ in elements); ZeRO-3 all-gathers bf16 parameters twice
(forward, backward) and reduce-scatters fp32 gradients (3Ψ), the root group (embeddings, norm,
head) gathered once; HSDP adds an all-reduce of the shard over the replicas; TP 4 all-reduces of a
(b, s, d) bf16 activation per layer (+2 at the vocabulary-parallel embedding and head); PP sends a
micro-batch's activation forward and its gradient back at each stage boundary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steps.analytic.memory import BF16, FP32, GRAD_REDUCE
from steps.analytic.params import gpt_local_params, local_params, mlp_local_params

if TYPE_CHECKING:  # annotations only: this package imports neither torch nor the plans
    from steps.models.shapes import Shape
    from steps.scale.scale_plan import ScalePlan
    from steps.sharding.plan import Plan

# collective -> factor(N); the bytes it is charged on: an all-reduce's input, an all-gather's
# output, a reduce-scatter's input (N× its output), a send's tensor
RING = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
}


def ring_bytes(op: str, nbytes: float, n: int) -> float:
    """Bytes one rank sends for collective `op` over `n` ranks, charged on `nbytes` (see RING)."""
    return RING[op](n) * nbytes


def ring_all_reduce(nbytes: float, n: int) -> float:
    return ring_bytes("all_reduce", nbytes, n)


def ring_gather(nbytes: float, n: int) -> float:
    """An all-gather producing, or a reduce-scatter consuming, `nbytes`."""
    return ring_bytes("all_gather", nbytes, n)


def fsdp_bytes(psi: float, root: float, b: int, n: int) -> float:
    """FSDP2 over n ranks, one dtype: 3Ψ (gather forward, gather backward, reduce-scatter) but the root
    group's 2Ψ_root, kept gathered from forward to backward (see gpt_comm). Mixed precision splits the
    same rule in two collectives of their own dtypes: fsdp_collectives."""
    return (3 * psi - root) * ring_gather(b, n)


def fsdp_collectives(psi: float, root: float, n: int, param_bytes: int, grad_bytes: int) -> tuple[float, float]:
    """FSDP2 over n ranks with a mixed-precision policy: the parameters all-gathered in forward and
    again in backward (2Ψ, the root group's Ψ_root once), the gradients reduce-scattered (Ψ).
    Returns (all_gather, reduce_scatter) bytes."""
    return (
        ring_bytes("all_gather", (2 * psi - root) * param_bytes, n),
        ring_bytes("reduce_scatter", psi * grad_bytes, n),
    )


def ep_all_to_all(assignment_bytes: float, experts: int, n: int) -> float:
    """One MoE layer's all-to-alls over an ep group of n ranks, per step: four of the rank's
    tokens·top_k assignments (`assignment_bytes`: dispatch and combine, forward and backward) and one
    of the E int64 row counts. Balanced routing, the convention of comm.all_to_all_single (exact as a
    mean over the ranks)."""
    return 4 * ring_bytes("all_to_all", assignment_bytes, n) + ring_bytes("all_to_all", experts * 8, n)


def shard_axis(fsdp: int, ep: int) -> str:
    """The comm key of the group ZeRO-3 shards the dense parameters over (by_collective's and the
    simulation's, steps/scale/fakeworld.py)."""
    return "dp_shard" if fsdp > 1 and ep > 1 else "ep" if ep > 1 else "fsdp"


# ---- the sharding stage: the MLP (from scratch and JAX) ------------------------------------------
def mlp_comm(plan: Plan) -> float:
    """Bytes one rank sends per step (for PP: the average over stages)."""
    d, L, b = plan.mlp.dim, plan.mlp.layers, plan.bytes_per_elem
    rows = plan.batch_size / plan.data_size
    total = 0.0
    t = plan.axis("tp")
    if t > 1:  # per block one (rows, dim) all-reduce forward (reduce-from) and one backward (copy-to),
        total += (2 * L - 1) * ring_all_reduce(rows * d * b, t)  # the first block's copy-to skipped
    shard_psi = mlp_local_params(plan) * plan.axis("fsdp")  # what the data axis replicates or shards
    if plan.axis("dp") > 1:  # HSDP (dp×fsdp): the replicas all-reduce their reduce-scattered shard
        total += ring_all_reduce(shard_psi / plan.axis("fsdp") * b, plan.axis("dp"))
    if plan.axis("fsdp") > 1:
        total += 3 * ring_gather(shard_psi * b, plan.axis("fsdp"))
    s = plan.axis("pp")
    if s > 1:  # every boundary carries the batch's activations forward and their gradients back
        total += 2 * (s - 1) * plan.batch_size * d * b / s
    return total


# ---- the sharding stage: the GPT (native torch, and its blocks in JAX) ----------------------------
def gpt_comm(plan: Plan, shapes: dict[str, int]) -> float:
    """DP 2Ψ, FSDP 3Ψ over the data axis; TP 4 activation all-reduces (B·T·d) per layer per step
    (attention and MLP, forward and backward; with SequenceParallel an all-gather + reduce-scatter
    pair, the same bytes; 2 with a MoE, which TP leaves replicated); PP the boundary activations
    forward and gradients backward; a MoE's router statistics over the data ranks (moe_stats_comm)."""
    g, b = plan.gpt, plan.bytes_per_elem
    rows = plan.batch_size / plan.data_size
    if plan.axis("ep") > 1:
        return ep_comm(plan, shapes, rows)
    total = 0.0
    t = plan.axis("tp")
    if t > 1:
        act = rows * g["block_size"] * g["n_embd"] * b
        sharded = 2 if g.get("moe") else 4  # a MoE is not TP-sharded (replicated over tp): attention's two
        # under PP a rank runs its stage's n_layer/pp blocks (its M microbatches sum to its rows)
        total += sharded * g["n_layer"] / plan.axis("pp") * ring_all_reduce(act, t)
        if plan.sequence_parallel:  # entering the region costs an all-gather backward, leaving it one forward
            total += 2 * ring_gather(act, t)
    shard_psi = gpt_local_params(plan, shapes) * plan.axis("fsdp")
    if plan.axis("dp") > 1:  # HSDP (dp×fsdp): the replicas all-reduce their reduce-scattered shard
        total += ring_all_reduce(shard_psi / plan.axis("fsdp") * b, plan.axis("dp"))
    if plan.axis("fsdp") > 1:
        # FSDP2 keeps the root group (embeddings, ln_f; the head is tied) gathered from forward to
        # backward — it would be re-gathered at once — so the root moves 2Ψ_root, the blocks 3Ψ
        root = gpt_local_params(plan, {k: n for k, n in shapes.items() if ".h." not in k}) * plan.axis("fsdp")
        if plan.pipelined:  # torchtitan under PP: no group reshards after forward (one gather a step, 2Ψ)
            root = shard_psi
        total += fsdp_bytes(shard_psi, root, b, plan.axis("fsdp"))
    s = plan.axis("pp")
    if s > 1:  # each data rank's rows through the pipeline: the stages' mean of activations + gradients
        total += 2 * (s - 1) * rows * g["block_size"] * g["n_embd"] * b / s
    return total + moe_stats_comm(plan)


def moe_stats_comm(plan: Plan) -> float:
    """A MoE's load-balancing statistics (2E numbers per layer) all-reduced over the data ranks,
    forward and backward (steps/sharding/router_stats.py); 0 without MoE or a data axis."""
    moe, n = plan.gpt.get("moe"), plan.data_size
    if not moe or n == 1:
        return 0.0
    return plan.gpt["n_layer"] * 2 * ring_all_reduce(2 * moe["experts"] * plan.bytes_per_elem, n)


def ep_comm(plan: Plan, shapes: dict[str, int], rows: float) -> float:
    """Expert parallelism (steps/sharding/expert_parallel.py), per step: per MoE layer four all-to-alls over ep
    of the rank's rows·T·k assignments of C numbers (dispatch and combine, forward and backward) and one
    of the E row counts (int64) (ep_all_to_all); the load-balancing statistics' all-reduce over every
    data rank (moe_stats_comm). Dense parameters: under ep, DP's all-reduce over ep (2Ψ_dense); under
    fsdp_ep, FSDP2 over all fsdp·ep ranks, and the experts' E/ep share FSDP2 over fsdp (3Ψ each:
    expert groups are never the root)."""
    g, b, n, f = plan.gpt, plan.bytes_per_elem, plan.axis("ep"), plan.axis("fsdp")
    E, k = g["moe"]["experts"], g["moe"]["top_k"]
    experts = sum(v for name, v in shapes.items() if ".mlp.experts." in name)
    dense = sum(shapes.values()) - experts
    per_layer = ep_all_to_all(rows * g["block_size"] * k * g["n_embd"] * b, E, n)
    if f > 1:
        root = sum(v for name, v in shapes.items() if ".h." not in name)
        params = fsdp_bytes(dense, root, b, n * f) + fsdp_bytes(experts / n, 0, b, f)
    else:
        params = ring_all_reduce(dense * b, n)
    return params + g["n_layer"] * per_layer + moe_stats_comm(plan)


# ---- the scale stage: a named shape on a ScalePlan ------------------------------------------------
def by_collective(shape: Shape, plan: ScalePlan, ac: str | None = None) -> dict[str, float]:
    """Bytes one rank sends per step, by "<axis>/<collective>". Full AC (`ac`, default the plan's)
    runs each block's forward again in backward with its TP collectives, but for the last one: the
    non-reentrant checkpoint stops rebuilding once every tensor backward needs is back, and the
    block's output is not among them (no SP: 1 of the 2 forward all-reduces per layer; SP: both
    all-gathers, 1 of the 2 reduce-scatters). torchtitan's selective AC saves the collectives'
    outputs: nothing is repeated."""
    redo = shape.layers / plan.axis("pp") if (plan.ac if ac is None else ac) == "full" else 0.0
    psi = local_params(shape, plan)
    out: dict[str, float] = {}
    dp, fs, t, p = (plan.axis(a) for a in ("dp", "fsdp", "tp", "pp"))
    z = plan.zero_stage
    if plan.axis("ep") > 1:
        return out | moe_ep_comm(shape, plan)
    if fs > 1:
        root = psi - local_params(shape, plan, layers_only=True)
        out["fsdp/all_gather"], out["fsdp/reduce_scatter"] = fsdp_collectives(psi, root, fs, BF16, GRAD_REDUCE)
    shard = psi / fs
    if dp > 1 and z in (1, 2):
        out["dp/reduce_scatter"] = ring_bytes("reduce_scatter", shard * GRAD_REDUCE, dp)
        out["dp/all_gather"] = ring_bytes("all_gather", shard * BF16, dp)
    elif dp > 1:
        out["dp/all_reduce"] = ring_bytes("all_reduce", shard * GRAD_REDUCE, dp)
    if t > 1 and plan.sp:
        out |= sp_comm(shape, plan, redo)
    elif t > 1:
        act = plan.micro_batch * plan.seq * shape.d * BF16
        n = 4 * shape.layers / p + redo + (2 if shape.family == "llama" else 0)
        out["tp/all_reduce"] = n * plan.microbatches * ring_bytes("all_reduce", act, t)
    if p > 1:  # average over stages: p-1 boundaries, forward activation + backward gradient
        act = plan.micro_batch * plan.seq * shape.d * BF16 / (t if plan.sp else 1)
        out["pp/send"] = 2 * (p - 1) / p * plan.microbatches * act
    return out


def moe_ep_comm(shape: Shape, plan: ScalePlan) -> dict[str, float]:
    """Expert parallelism over ep (steps/scale/balanced_moe.py; the sharding stage's ep_comm at bf16
    compute): the dense parameters FSDP2 over fsdp × ep (`dp_shard`; `ep`
    alone without fsdp), 3Ψ_dense less the root group's Ψ_root; each layer's E/ep experts FSDP2 over
    fsdp, 3·Ψ_experts/ep; per MoE layer four all-to-alls of the rank's b·s·k rows of d bf16 numbers
    (dispatch and combine, forward and backward, balanced routing), one of the E int64 row counts,
    and the load-balancing statistics' fp32 all-reduce of 2E numbers over every data rank, forward
    and backward. HSDP (a dp axis) all-reduces the fp32 gradient shard over dp."""
    dp, fs, n, E = plan.axis("dp"), plan.axis("fsdp"), plan.axis("ep"), shape.experts
    key, psi = shard_axis(fs, n), local_params(shape, plan)
    experts = shape.expert_params()
    dense, root = psi - experts, psi - local_params(shape, plan, layers_only=True)
    rows = plan.micro_batch * plan.seq * shape.top_k * shape.d * BF16
    gather, scatter = fsdp_collectives(dense, root, plan.shard, BF16, GRAD_REDUCE)
    out = {f"{key}/all_gather": gather, f"{key}/reduce_scatter": scatter}
    out[f"{key}/all_reduce"] = shape.layers * 2 * ring_bytes("all_reduce", 2 * E * FP32, plan.shard)
    out["ep/all_to_all"] = shape.layers * ep_all_to_all(rows, E, n)
    if fs > 1:  # the experts: FSDP2 over fsdp, never the root group
        out["fsdp/all_gather"], out["fsdp/reduce_scatter"] = fsdp_collectives(experts / n, 0, fs, BF16, GRAD_REDUCE)
    if dp > 1:
        out["dp/all_reduce"] = ring_bytes("all_reduce", psi / plan.shard * GRAD_REDUCE, dp)
    return out


def sp_comm(shape: Shape, plan: ScalePlan, redo: float = 0.0) -> dict[str, float]:
    """Sequence parallel: each of TP's 4 all-reduces per layer becomes an all-gather and a
    reduce-scatter (the same bytes); entering the sequence-sharded region and leaving it (our GPT:
    the first block, ln_f; Llama: the vocabulary-parallel embedding and head, as without SP) adds
    one activation gather each way; the norms' weight gradients are partial sums over the tp ranks,
    all-reduced in bf16 in backward (FSDP2's post-backward; without FSDP in the optimizer step)."""
    t, L, m = plan.axis("tp"), shape.layers / plan.axis("pp"), plan.microbatches
    act = plan.micro_batch * plan.seq * shape.d * BF16
    llama = shape.family == "llama"
    # our GPT: in at the first block (a local slice; its gradient gathered), out before ln_f (gathered);
    # Llama: the embedding reduce-scatters (gradient gathered), the head gathers (gradient scattered)
    gathers, scatters = 4 * L + 2 + 2 * redo, 4 * L + (2 if llama else 0) + redo
    norms = L * (2 if llama else 4) * shape.d + (shape.d if llama else 0)  # torchtitan: the final norm too
    return {
        "tp/all_gather": m * gathers * ring_bytes("all_gather", act, t),
        "tp/reduce_scatter": m * scatters * ring_bytes("reduce_scatter", act, t),
        "tp/all_reduce": norms * BF16 * ring_bytes("all_reduce", 1, t),
    }
