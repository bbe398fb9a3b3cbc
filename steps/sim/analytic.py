"""The Playbook's formulas for one rank of a plan: state, activations, communication per step.

State (mixed-precision Adam, the Ultra-Scale Playbook's accounting): bf16 parameters 2Ψ, bf16
gradients 2Ψ, optimizer k = 12 bytes per parameter (fp32 master copy 4 + Adam's two fp32
moments 8), 16Ψ in all; over a data axis of N ranks ZeRO-1 divides the 12, ZeRO-2 the grads too,
ZeRO-3 all 16. Ψ is the rank's own parameter count after TP (norms stay whole) and PP (its stage).
FSDP2 splits the same 16 bytes differently — fp32 sharded parameters are the master copy, fp32
gradients (reduce_dtype), 8 for the moments; bf16 copies exist only while a layer runs — so for DP
and ZeRO-3 the totals compare one to one. For ZeRO-1/2 the torch implementations keep gradients
in the fp32 the communication reduces, not the Playbook's bf16: `held_state` is that accounting
(what the memory prediction, `fits` and the plan search use); `state` stays the Playbook's.

Activations (bytes autograd saves per token and layer, bf16 compute with FSDP2's param_dtype;
counted op by op for the two modules the simulation runs, and matched exactly by it):
  llama  2 RMSNorms × (fp32 input 4d + rstd 4 + normalized 2d + weighted 2d)  = 16d + 8
         attention: q 2d, k and v 2·kv each, output 2d, logsumexp 4·heads    = 4d + 4kv + 4H
         SwiGLU: gate, SiLU(gate), up, their product (2·ffn each)            = 8·ffn
  gpt2   2 LayerNorms × (input 2d + mean/rstd 4 + output 2d)                 = 8d + 8
         attention as above (kv = d); GELU MLP: c_fc output, GELU output    = 4·ffn
  TP (no SP) divides what lies between the column- and row-parallel matmuls (the norms stay);
  SP (Megatron) divides everything by t. Full recompute keeps each layer's bf16 input (2d) and
  rebuilds one layer at a time in backward; selective is torchtitan's op-level policy
  (selective_bytes_per_token). The Playbook's / Korthikanti et al.'s per-layer formula
  (korthikanti_per_layer: GPT-3 block, 4d MLP, dropout masks) is what the report's
  "saved sim÷Playbook" sets the simulated layer against; README says term by term where they part.
  Head: final norm, the fp32 log-probabilities of the cross-entropy (4V, ÷t when the head is
  vocabulary-parallel), token ids (int64, 8); RoPE's cos/sin are shared by all layers (small).

Communication (ring-equivalent bytes one rank sends, steps/parallel/analytic.py's RING factors):
DP all-reduces fp32 gradients (2Ψ·4); ZeRO-1/2 reduce-scatter them and all-gather bf16 parameters
(the same 2Ψ in elements); ZeRO-3 all-gathers bf16 parameters twice (forward, backward) and
reduce-scatters fp32 gradients (3Ψ), the root group (embeddings, norm, head) gathered once; HSDP
adds an all-reduce of the shard over the replicas; TP 4 all-reduces of a (b, s, d) bf16 activation
per layer (+2 at the vocabulary-parallel embedding and head); PP sends a micro-batch's activation
forward and its gradient back at each stage boundary.
"""

from __future__ import annotations

from steps.parallel.analytic import ring_bytes
from steps.sim.scale_plan import ScalePlan
from steps.sim.shapes import Shape

BF16, FP32 = 2, 4
K_ADAM = 12  # Playbook: fp32 master + 2 fp32 moments, bytes per parameter
GRAD_REDUCE = FP32  # the dtype gradients are reduced in (FSDP2's reduce_dtype): comm and held_state use it


# ---- parameters per rank ------------------------------------------------------------------------
def local_params(shape: Shape, plan: ScalePlan, layers_only: bool = False) -> float:
    """Parameters of one rank after TP and PP, before the data axis. With PP: the worst stage (the
    first, with the embeddings, or the last, with the head: a tied head needs its own copy there)."""
    t, p, L = plan.axis("tp"), plan.axis("pp"), shape.layers
    rep = shape.layer_replicated()
    body = ((shape.groups()["layers"] / L - rep) / t + rep) * L / p
    if layers_only:
        return body
    ends = {k: sharded / t + whole for k, (sharded, whole) in shape.ends().items()}
    if p > 1:
        return body + max(ends.values())
    g = shape.groups()
    if shape.family == "gpt2":  # one tied table
        return body + g["embed"] + g["pos"] + g["norm_f"]
    return body + ends["first"] + ends["last"]


def state(shape: Shape, plan: ScalePlan) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state on one rank (Playbook split)."""
    psi = local_params(shape, plan)
    n = plan.shard if plan.zero_stage == 3 else plan.axis("dp")
    z = plan.zero_stage
    out = {
        "params": BF16 * psi / (n if z >= 3 else 1),
        "grads": BF16 * psi / (n if z >= 2 else 1),
        "optim": K_ADAM * psi / (n if z >= 1 else 1),
    }
    out["state"] = sum(out.values())
    return out


def held_state(shape: Shape, plan: ScalePlan) -> dict[str, float]:
    """Bytes of state one rank of the torch implementation holds, gradients in the dtype `comm`
    reduces them in (GRAD_REDUCE, fp32): what `fits`, memory per GPU and the plan search use.
    The Playbook's `state` stays the reported analytic number; the two differ for ZeRO-1/2 only.

      DP / ZeRO-3 (FSDP2, HSDP)  fp32 params 4 + fp32 grads 4 + moments 8 = 16Ψ, ÷ the shard axis
                 (simulated: equal to the byte; DP is HSDP with a shard axis of one)
      ZeRO-2     FSDP2 with reshard_after_forward=False (simulated): 16Ψ/N fp32 shards + every
                 layer's bf16 parameters held from forward to backward, 2Ψ (Playbook: 2Ψ + 14Ψ/N)
      ZeRO-1     Megatron-Core's DistributedDataParallel + DistributedOptimizer (PyTorch; the
                 distributed optimizer with fp32 gradient buffers): bf16 params 2Ψ and the fp32
                 gradient buffer 4Ψ replicated, fp32 master 4Ψ/N + moments 8Ψ/N = 6Ψ + 12Ψ/N
                 (Megatron's docs: 6 + 12/d bytes per parameter). Its comm is what `comm` charges:
                 reduce-scatter of the fp32 gradients, all-gather of the bf16 parameters. (torch's
                 ZeroRedundancyOptimizer under DDP would hold fp32 params and grads, 8Ψ + 8Ψ/N, and
                 all-reduce + broadcast fp32 instead: not this plan.) Analytic only (no FSDP2 form).
    """
    psi = local_params(shape, plan)
    z = plan.zero_stage
    if z in (1, 2):
        n = plan.axis("dp")
        out = {
            "params": BF16 * psi + (FP32 * psi / n if z == 2 else 0.0),
            "grads": GRAD_REDUCE * psi / (n if z == 2 else 1),
            "optim": (K_ADAM - (0 if z == 1 else FP32)) * psi / n,
        }
    else:
        n = plan.shard if z == 3 else 1
        out = {"params": FP32 * psi / n, "grads": GRAD_REDUCE * psi / n, "optim": (K_ADAM - FP32) * psi / n}
    out["state"] = sum(out.values())
    return out


# ---- activations --------------------------------------------------------------------------------
def layer_bytes_per_token(shape: Shape, plan: ScalePlan) -> float:
    d, kv, f, H = shape.d, shape.kv_dim, shape.ffn, shape.heads
    t = plan.axis("tp")
    if shape.experts:  # see moe_bytes_per_token
        norms, inner = 16 * d + 8, 4 * d + 4 * kv + 4 * H + moe_bytes_per_token(shape)
    elif shape.family == "llama":
        norms, inner = 16 * d + 8, 4 * d + 4 * kv + 4 * H + 8 * f
    else:
        norms, inner = 8 * d + 8, 4 * d + 4 * kv + 4 * H + 4 * f
    return (norms / t if plan.sp else norms) + inner / t


def moe_bytes_per_token(shape: Shape) -> float:
    """An MoE layer's MLP, per token (an estimate, not an op count: the report's `saved sim÷op count`
    says how far it is): each of its top_k rows saves the gathered bf16 input (2d), SwiGLU's four
    ffn-wide bf16 tensors (8·ffn) and the expert output the gate weight multiplies (2d); the router
    its fp32 softmax (4E). Measured on a tiny MoE at world 8 by varying d, k, ffn, E and the heads
    one at a time, the simulated layer exceeds this (with the llama formula for the rest of the
    layer) by 6d + head_dim + 4 + k·(2d + 30) bytes per token: per row 30 = the int64 top-k index,
    assignment order and token index (3 × 8) and the gate weight in fp32 and bf16 (4 + 2); the
    other 2d per row and the 6d + head_dim + 4 (our GPT's RMSNorm and RoPE against the HF Llama
    the dense formula counts) are not yet attributed op by op."""
    return shape.top_k * (8 * shape.ffn + 4 * shape.d) + 4 * shape.experts


def selective_bytes_per_token(shape: Shape, plan: ScalePlan) -> float:
    """torchtitan's op-level SAC: a layer keeps its input (2d), the attention kernel's output and
    logsumexp, and every second matmul output (half of q, k, v, o, gate, up, down); the
    element-wise ops (norms, RoPE, SiLU, products) are recomputed in backward."""
    d, kv, f, H, t = shape.d, shape.kv_dim, shape.ffn, shape.heads, plan.axis("tp")
    mm = (2 * d + 4 * kv + 2 * d + (4 * f if shape.family == "llama" else 2 * f) + 2 * d) / 2
    return 2 * d / (t if plan.sp else 1) + (mm + 2 * d + 4 * H) / t


def korthikanti_per_layer(shape: Shape, plan: ScalePlan, ac: str = "none", flash: bool = True) -> float:
    """Korthikanti et al. 2022 (the Playbook's activation memory): bytes one layer saves for a
    micro-batch of s·b tokens (h = d, a heads): 34·s·b·h + 5·a·s²·b, the second term the attention
    scores, softmax and its dropout, which a flash / SDPA kernel does not store (our steps use SDPA:
    `flash`). TP without SP: s·b·h·(10 + 24/t) (+ 5·a·s²·b/t); SP: 34·s·b·h/t; full recompute: the
    layer's input, 2·s·b·h (÷ t with SP); their selective recompute drops the scores term only."""
    s, b, h, t = plan.seq, plan.micro_batch, shape.d, plan.axis("tp")
    sbh = s * b * h
    if ac == "full":
        return 2 * sbh / (t if plan.sp else 1)
    body = 34 * sbh / t if plan.sp else sbh * (10 + 24 / t)
    return body + (0.0 if flash or ac == "selective" else 5 * shape.heads * s * s * b / t)


def head_bytes_per_token(shape: Shape, plan: ScalePlan, batch: int) -> float:
    d, V, t = shape.d, shape.vocab, plan.axis("tp")
    if shape.family == "llama":
        rope = 2 * shape.head_dim * BF16 / batch
        return 8 * d + 4 + 4 * V / t + 8 + rope
    return 4 * d + 4 + 4 * V + 8 + 8 / batch  # + the int64 position ids of wpe


def sp_gathered_bytes_per_token(shape: Shape, plan: ScalePlan) -> float:
    """What torch's DTensor SP keeps beyond Megatron's formula: the column-parallel matmuls after
    each norm save their all-gathered (full-sequence) bf16 input, while the norm's own sharded
    output is not saved (LayerNorm/RMSNorm backward reads its input): 2 norms × 2d·(1 − 1/t) per
    token and layer. Megatron-SP counts the shard only (it re-gathers in backward)."""
    t = plan.axis("tp")
    return 2 * 2 * shape.d * (1 - 1 / t) if plan.sp and t > 1 else 0.0


def activations(shape: Shape, plan: ScalePlan, ac: str | None = None) -> dict[str, float]:
    """Saved bytes of one rank's forward (micro-batch × seq tokens; with PP the first stage holds
    p micro-batches of its L/p layers under 1F1B, L layers' worth in all). `saved` is the peak:
    with AC, what the forward kept (`kept`) plus one layer rebuilt in backward."""
    ac = plan.ac if ac is None else ac
    b = plan.micro_batch
    tokens = b * plan.seq
    per_layer = layer_bytes_per_token(shape, plan) * tokens
    layers = shape.layers  # pp: L/p layers × p micro-batches in flight
    rebuilt = per_layer if ac in ("full", "selective") else 0.0
    if ac == "full":
        kept = layers * 2 * shape.d * tokens / (plan.axis("tp") if plan.sp else 1)
    elif ac == "selective":
        kept = layers * selective_bytes_per_token(shape, plan) * tokens
    else:
        kept = layers * per_layer
    head = head_bytes_per_token(shape, plan, b) * tokens
    gathered = layers * sp_gathered_bytes_per_token(shape, plan) * tokens if ac == "none" else 0.0
    return {
        "per_layer": per_layer,
        "kept": kept + head,
        "saved": kept + head + rebuilt,
        "sp_gathered": gathered,
        "korthikanti_per_layer": korthikanti_per_layer(shape, plan, ac),
    }


# ---- communication ------------------------------------------------------------------------------
def comm(shape: Shape, plan: ScalePlan, ac: str | None = None) -> dict[str, float]:
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
        out["fsdp/all_gather"] = ring_bytes("all_gather", (2 * psi - root) * BF16, fs)
        out["fsdp/reduce_scatter"] = ring_bytes("reduce_scatter", psi * GRAD_REDUCE, fs)
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
    """Expert parallelism over ep (steps/sim/moe.py; the sharding stage's analytic, steps/parallel/
    analytic.ep_comm, at bf16 compute): the dense parameters FSDP2 over fsdp × ep (`dp_shard`; `ep`
    alone without fsdp), 3Ψ_dense less the root group's Ψ_root; each layer's E/ep experts FSDP2 over
    fsdp, 3·Ψ_experts/ep; per MoE layer four all-to-alls of the rank's b·s·k rows of d bf16 numbers
    (dispatch and combine, forward and backward, balanced routing), one of the E int64 row counts,
    and the load-balancing statistics' fp32 all-reduce of 2E numbers over every data rank, forward
    and backward. HSDP (a dp axis) all-reduces the fp32 gradient shard over dp."""
    from steps.sim.fakeworld import shard_axis  # one home for the key (the simulation uses it too)

    dp, fs, n, E = plan.axis("dp"), plan.axis("fsdp"), plan.axis("ep"), shape.experts
    key, psi = shard_axis(fs, n), local_params(shape, plan)
    experts = shape.expert_params()
    dense, root = psi - experts, psi - local_params(shape, plan, layers_only=True)
    rows = plan.micro_batch * plan.seq * shape.top_k * shape.d * BF16
    out = {
        f"{key}/all_gather": ring_bytes("all_gather", (2 * dense - root) * BF16, plan.shard),
        f"{key}/reduce_scatter": ring_bytes("reduce_scatter", dense * GRAD_REDUCE, plan.shard),
        f"{key}/all_reduce": shape.layers * 2 * ring_bytes("all_reduce", 2 * E * FP32, plan.shard),
        "ep/all_to_all": shape.layers * (4 * ring_bytes("all_to_all", rows, n) + ring_bytes("all_to_all", 8 * E, n)),
    }
    if fs > 1:
        out["fsdp/all_gather"] = ring_bytes("all_gather", 2 * experts / n * BF16, fs)
        out["fsdp/reduce_scatter"] = ring_bytes("reduce_scatter", experts / n * GRAD_REDUCE, fs)
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
