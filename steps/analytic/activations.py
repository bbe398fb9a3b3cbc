"""Saved activations of one rank at scale (the scale stage): bytes autograd saves per token and
layer, bf16 compute with FSDP2's param_dtype, counted op by op for the two modules the simulation
runs, and matched exactly by it:
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
  "saved sim÷Playbook" sets the simulated layer against; docs/scale.md says term by term where they part.
  Head: final norm, the fp32 log-probabilities of the cross-entropy (4V, ÷t when the head is
  vocabulary-parallel), token ids (int64, 8); RoPE's cos/sin are shared by all layers (small).
One GPU's eager step (the perf stage) has its own op count: steps/analytic/memory.py, step_memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steps.analytic.memory import BF16

if TYPE_CHECKING:  # annotations only: this package imports neither torch nor the plans
    from steps.models.shapes import Shape
    from steps.scale.scale_plan import ScalePlan


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
