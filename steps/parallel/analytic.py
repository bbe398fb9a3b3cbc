"""What each strategy should cost, from the plan alone: per-rank state bytes and per-rank
communication bytes per step. Measured numbers are divided by these; a ratio of 1 means the
implementation moves and keeps exactly what the theory says.

The ring convention ("ring-equivalent bytes sent per rank"), the one place its factors live: over
a group of N ranks an all-reduce of n bytes costs 2(N-1)/N·n (a reduce-scatter then an
all-gather), an all-gather producing n bytes and a reduce-scatter consuming n bytes cost
(N-1)/N·n, a point-to-point send of n bytes costs n. So DP moves 2Ψ·(N-1)/N·b per step and FSDP
3Ψ·(N-1)/N·b (all-gather forward, all-gather backward, reduce-scatter of the gradients).
comm.py counts torch's collectives and jax/measure.py the compiled HLO's with these factors.

Ψ = parameter count, b = bytes per element, N = size of the axis that shards or replicates,
state = params + grads + optimizer moments = plan.state_tensors × the local parameter count
(4 with Adam, 3 with SGD-momentum).
"""

from __future__ import annotations

from steps.parallel.plan import Plan

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


# ---- the MLP (from scratch and JAX) ----------------------------------------------------------
def mlp_psi(plan: Plan) -> int:
    d, h, L = plan.mlp["dim"], plan.mlp["hidden"], plan.mlp["layers"]
    return L * (2 * d * h + h + d)


def mlp_local_params(plan: Plan) -> float:
    """Parameters one rank holds: TP splits W1, b1, W2 (b2 is replicated); FSDP/PP divide by N."""
    d, h, L = plan.mlp["dim"], plan.mlp["hidden"], plan.mlp["layers"]
    t = plan.axis("tp")
    local = L * ((2 * d * h + h) / t + d)
    return local / plan.axis("fsdp") / plan.axis("pp")


def mlp_comm(plan: Plan) -> float:
    """Bytes one rank sends per step (for PP: the average over stages)."""
    d, L, b = plan.mlp["dim"], plan.mlp["layers"], plan.bytes_per_elem
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


def mlp_costs(plan: Plan) -> dict:
    """The engines' analytic(): state bytes, comm bytes, parameter count of the MLP."""
    return {
        "state_bytes": plan.state_tensors * mlp_local_params(plan) * plan.bytes_per_elem,
        "comm_bytes": mlp_comm(plan),
        "params": mlp_psi(plan),
    }


# ---- the GPT (native torch, and its blocks in JAX) ---------------------------------------------
def gpt_tp_split(name: str) -> str:
    """How native TP places a GPT parameter: 'shard' (divided by tp) or 'replicate'."""
    col = ("q_proj", "k_proj", "v_proj", "c_fc", "c_fc2")  # c_fc2: SwiGLU's gate
    if any(f".{c}." in name for c in col):
        return "shard"
    if name.endswith(("o_proj.weight", "c_proj.weight")):
        return "shard"
    return "replicate"


def gpt_local_params(plan: Plan, shapes: dict[str, int], stage_params: float | None = None) -> float:
    """`shapes`: parameter name -> numel of the single-device model (tied weights once)."""
    if plan.strategy == "pp":
        return stage_params if stage_params is not None else sum(shapes.values()) / plan.axis("pp")
    t, e, f = plan.axis("tp"), plan.axis("ep"), plan.axis("fsdp")
    if e > 1 and f > 1:  # fsdp_ep: dense sharded over all f·e ranks, experts over e then f
        return sum(n / (e * f) for n in shapes.values())
    local = sum(
        n / t if gpt_tp_split(k) == "shard" else n / e if ".mlp.experts." in k else n for k, n in shapes.items()
    )
    return local / f


def gpt_comm(plan: Plan, shapes: dict[str, int]) -> float:
    """DP 2Ψ, FSDP 3Ψ over the data axis; TP 4 activation all-reduces (B·T·d) per layer per step
    (attention and MLP, forward and backward; with SequenceParallel an all-gather + reduce-scatter
    pair, the same bytes); PP the boundary activations forward and gradients backward."""
    g, b = plan.gpt, plan.bytes_per_elem
    rows = plan.batch_size / plan.data_size
    if plan.axis("ep") > 1:
        return ep_comm(plan, shapes, rows)
    total = 0.0
    t = plan.axis("tp")
    if t > 1:
        act = rows * g["block_size"] * g["n_embd"] * b
        total += 4 * g["n_layer"] * ring_all_reduce(act, t)
        if plan.sequence_parallel:  # entering the region costs an all-gather backward, leaving it one forward
            total += 2 * ring_gather(act, t)
    shard_psi = gpt_local_params(plan, shapes) * plan.axis("fsdp")
    if plan.axis("dp") > 1:  # HSDP (dp×fsdp): the replicas all-reduce their reduce-scattered shard
        total += ring_all_reduce(shard_psi / plan.axis("fsdp") * b, plan.axis("dp"))
    if plan.axis("fsdp") > 1:
        # FSDP2 keeps the root group (embeddings, ln_f; the head is tied) gathered from forward to
        # backward — it would be re-gathered at once — so the root moves 2Ψ_root, the blocks 3Ψ
        root = gpt_local_params(plan, {k: n for k, n in shapes.items() if ".h." not in k}) * plan.axis("fsdp")
        total += (3 * shard_psi - root) * ring_gather(b, plan.axis("fsdp"))
    s = plan.axis("pp")
    if s > 1:
        total += 2 * (s - 1) * plan.batch_size * g["block_size"] * g["n_embd"] * b / s
    return total


def fsdp_bytes(psi: float, root: float, b: int, n: int) -> float:
    """FSDP2 over n ranks: 3Ψ (gather forward, gather backward, reduce-scatter) but the root group's
    2Ψ_root, kept gathered from forward to backward (see gpt_comm)."""
    return (3 * psi - root) * ring_gather(b, n)


def ep_comm(plan: Plan, shapes: dict[str, int], rows: float) -> float:
    """Expert parallelism (steps/parallel/ep.py), per step: per MoE layer four all-to-alls over ep
    of the rank's rows·T·k assignments of C numbers (dispatch and combine, forward and backward), one
    of the E row counts (int64), and the load-balancing statistics' all-reduce of 2E numbers over
    every data rank, forward and backward. All-to-alls in the balanced-routing convention of
    comm.all_to_all_single (exact as a mean over the ranks). Dense parameters: under ep, DP's
    all-reduce over ep (2Ψ_dense); under fsdp_ep, FSDP2 over all fsdp·ep ranks, and the experts'
    E/ep share FSDP2 over fsdp (3Ψ each: expert groups are never the root)."""
    g, b, n, f = plan.gpt, plan.bytes_per_elem, plan.axis("ep"), plan.axis("fsdp")
    E, k = g["moe"]["experts"], g["moe"]["top_k"]
    experts = sum(v for name, v in shapes.items() if ".mlp.experts." in name)
    dense = sum(shapes.values()) - experts
    per_layer = 4 * ring_bytes("all_to_all", rows * g["block_size"] * k * g["n_embd"] * b, n)
    per_layer += ring_bytes("all_to_all", E * 8, n) + 2 * ring_all_reduce(2 * E * b, plan.data_size)
    if f > 1:
        root = sum(v for name, v in shapes.items() if ".h." not in name)
        params = fsdp_bytes(dense, root, b, n * f) + fsdp_bytes(experts / n, 0, b, f)
    else:
        params = ring_all_reduce(dense * b, n)
    return params + g["n_layer"] * per_layer


def gpt_costs(plan: Plan, shapes: dict[str, int], stage_params: float | None = None) -> dict:
    """The engines' analytic() for the GPT (or its blocks): state bytes, comm bytes, parameters."""
    return {
        "state_bytes": plan.state_tensors * gpt_local_params(plan, shapes, stage_params) * plan.bytes_per_elem,
        "comm_bytes": gpt_comm(plan, shapes),
        "params": sum(shapes.values()),
    }
