"""Bytes held: parameters, gradients and optimizer state, and one device's training step.

One GPU's eager step (the perf stage, step_memory; fp32 parameters with optional autocast):
    params      N · 4 (fp32 master weights; autocast keeps them fp32)
    grads       N · 4
    optimizer   N · 8 (AdamW exp_avg + exp_avg_sq; the per-tensor `step` scalars are noise), or
                Adafactor's factored second moments (adafactor_state_floats: R + C per R×C matrix,
                every element of a vector; no first moment) · 4
    activations what eager autograd saves for backward, per layer and per token (see ACT_* below)
    peak        params + optimizer + saved activations + logits + cross-entropy's two (B, T, V)
                fp32 gradients at the start of backward (grads do not exist yet in a steady step)
  The activation gap: the saved set is what "activations" usually means, but it is not the peak:
  with vocab 8192 the (B, T, V) logits, log-probs and their gradients outweigh all four layers'
  saved tensors; what is left between the analytic peak and the measured one is backward's
  short-lived per-op gradients, oneDNN scratch buffers and allocator slack. The model is of
  eager PyTorch: torch.compile peaks lower, because AOTAutograd's min-cut partitioner saves fewer
  tensors and recomputes cheap elementwise ops in backward.
The perf stage measures the same parts (steps/perf/memory.py) and sets them against these.

One rank of a plan at scale (the scale stage, state and held_state on a named shape):
  State (mixed-precision Adam, the Ultra-Scale Playbook's accounting): bf16 parameters 2Ψ, bf16
  gradients 2Ψ, optimizer k = 12 bytes per parameter (fp32 master copy 4 + Adam's two fp32
  moments 8), 16Ψ in all; over a data axis of N ranks ZeRO-1 divides the 12, ZeRO-2 the grads too,
  ZeRO-3 all 16. Ψ is the rank's own parameter count after TP (norms stay whole) and PP (its stage).
  FSDP2 splits the same 16 bytes differently — fp32 sharded parameters are the master copy, fp32
  gradients (reduce_dtype), 8 for the moments; bf16 copies exist only while a layer runs — so for DP
  and ZeRO-3 the totals compare one to one. For ZeRO-1/2 the torch implementations keep gradients
  in the fp32 the communication reduces, not the Playbook's bf16: `held_state` is that accounting
  (what the memory prediction, `fits` and the plan search use); `state` stays the Playbook's.
The sharding stage's per-rank state (steps/analytic/costs.py) is plan.state_tensors × its local
parameters × bytes per element: its cells train in one dtype.
Saved activations at scale: steps/analytic/activations.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steps.analytic.params import local_params, param_counts

if TYPE_CHECKING:  # annotations only: this package imports neither torch nor the plans
    from steps.models.shapes import Shape
    from steps.scale.scale_plan import ScalePlan

BF16, FP32 = 2, 4
K_ADAM = 12  # Playbook: fp32 master + 2 fp32 moments, bytes per parameter
GRAD_REDUCE = FP32  # the dtype gradients are reduced in (FSDP2's reduce_dtype): comm and held_state use it


# ---- one GPU's eager training step (the perf stage) ----------------------------------------------
# Activation elements per token per layer, grouped by who saves them (eager PyTorch, pre-LN block):
#   residual: ln_1 input, ln_2 input (the residual stream; stays fp32 under autocast)
#   matmul inputs: ln_1 out (one fused q/k/v matmul), ln_2 out (c_fc), GELU out (c_proj: 4d)
#   attention: q, k, v and the attention output (sdpa saves it and o_proj's input is a view of it;
#              the manual path's att @ v output is saved only as o_proj's input)
#   mlp: c_fc out (4d) saved by the GELU
# Plus, per layer, the concatenated q/k/v weight (3d², built each forward by attention.qkv and
# saved by its matmul; under autocast that is its low-precision copy, counted with the weights).
ACT_RESIDUAL = 2
ACT_MATMUL_IN = 1 + 1 + 4
ACT_ATTENTION = 4
ACT_MLP = 4
NORM_STATS = 4  # mean + rstd of two LayerNorms, fp32, per token (not per channel)


def step_memory(
    cfg,
    batch_size: int,
    amp: str = "none",
    checkpoint: bool = False,
    attn: str = "sdpa",
    optimizer_states: int = 2,
    grad_accum: int = 1,
    optimizer: str = "adamw",
) -> dict[str, float]:
    """Bytes of each part of one step's memory, for fp32 params with optional autocast.
    `batch_size` is the micro-batch; with grad_accum > 1 the grads exist during later backwards."""
    n = sum(param_counts(cfg).values())
    low = 2 if amp in ("bf16", "fp16") else 4  # bytes of an autocast (matmul) output
    d, L, T, H, V = cfg.n_embd, cfg.n_layer, cfg.block_size, cfg.n_head, cfg.vocab_size
    tokens = batch_size * T
    layer = tokens * (4 * d * ACT_RESIDUAL + low * d * (ACT_MATMUL_IN + ACT_ATTENTION + ACT_MLP) + 4 * NORM_STATS) + (
        3 * d * d * 4 if low == 4 else 0
    )
    if attn == "manual":  # the (T, T) probabilities per head, saved by softmax and by att @ v
        layer += batch_size * H * T * T * low
    else:  # sdpa's flash kernel saves a logsumexp per head and query
        layer += tokens * H * 4
    # head: ln_f input + stats, lm_head input, fp32 log-probs saved by cross-entropy; token ids
    # and shifted labels (int64)
    head = tokens * (4 * d + 8 + low * d + 4 * V) + tokens * 16
    chunk_logits = 0
    if getattr(cfg, "fused_ce", False):
        # chunked linear + cross-entropy (steps/models/chunked_ce.py) saves no logits: the
        # gradients w.r.t. its (fp32) input and the head weight, computed in forward, one
        # (chunk, V) block of logits + fp32 softmax + its gradient alive at a time
        from steps.models.chunked_ce import default_chunk_size  # torch: only for a fused-CE cell

        chunk = cfg.ce_chunk or default_chunk_size(tokens, V)
        head = tokens * (4 * d + 8) + tokens * 16 + tokens * d * 4 + V * d * 4
        chunk_logits = chunk * V * (low + 4 + 4)
    # checkpointing saves only each block's input; backward recomputes one block at a time
    saved = (L * tokens * d * 4 if checkpoint else L * layer) + head
    # autocast's low-precision weight copies saved for backward: the head's (unless the chunked
    # CE casts it itself, saving none) and the blocks' (recomputed under checkpointing)
    weights = (0 if chunk_logits else cfg.vocab_size * d) + (0 if checkpoint else L * 12 * d * d)
    out = {
        "params": 4 * n,
        "grads": 4 * n,
        "optimizer": 4 * (adafactor_state_floats(cfg) if optimizer == "adafactor" else optimizer_states * n),
        "activations": saved,
        "activations_per_layer": layer,
        # autocast's low-precision weight copies, saved for backward next to the activations
        "autocast_weights": 2 * weights if low == 2 else 0,
        # returned to the caller, alive until the step ends (chunked CE: one chunk's, in forward)
        "logits": chunk_logits or tokens * V * low,
        # first op of backward: cross-entropy's fp32 (B, T, V) gradients of the log-probs and
        # of the logits are alive together, while every saved activation still is
        "loss_backward": 0 if chunk_logits else 2 * tokens * V * 4,
        "recompute": layer if checkpoint else 0,
    }  # checkpointing: one block rebuilt in backward
    out["state"] = out["params"] + out["grads"] + out["optimizer"]
    # The peak of a steady-state step (grads were set to None by zero_grad): the start of
    # backward (of the last micro-batch: earlier ones left grads behind), or later when grads
    # have appeared while a checkpointed block is recomputed.
    start = (
        out["activations"]
        + out["autocast_weights"]
        + out["logits"]
        + out["loss_backward"]
        + (out["grads"] if grad_accum > 1 else 0)
    )
    late = out["grads"] + out["activations"] + out["recompute"]
    out["peak"] = out["params"] + out["optimizer"] + max(start, late)
    return out


def adafactor_state_floats(cfg) -> int:
    """Adafactor's state (Shazeer & Stern 2018; torch.optim.Adafactor) for a GPTConfig of
    param_counts' layout: an R×C matrix keeps a row and a column second moment (R + C floats), a
    vector its full second moment; no first moment. Matrices: wte (V×d), learned wpe (T×d), per layer
    Q, K, V, O (d×d) and the MLP's d×4d pair, an untied head (V×d); every other parameter a vector."""
    d, V, L = cfg.n_embd, cfg.vocab_size, cfg.n_layer
    mats = [(V, d)] + ([(cfg.block_size, d)] if cfg.pos == "learned" else []) + [(V, d)] * (not cfg.tie_weights)
    mats += [(d, d)] * 4 * L + [(4 * d, d)] * 2 * L
    vectors = sum(param_counts(cfg).values()) - sum(r * c for r, c in mats)
    return sum(r + c for r, c in mats) + vectors


def timeline_bytes(mem: dict, label: str, opt_ready: bool) -> float:
    """Analytic bytes alive at a timeline checkpoint (the seed's mem_usage notebook order)."""
    alive = mem["params"] + (mem["optimizer"] if opt_ready else 0)
    if label.startswith("inside forward"):  # after block i: i blocks' activations saved
        return alive + mem["activations_per_layer"] * int(label.rsplit(" ", 1)[1])
    # tracked tensors after forward: the saved set (the returned logits are not enumerable)
    forward = mem["activations"] + mem["autocast_weights"]
    return alive + {"after forward": forward, "after backward": mem["grads"], "after step": mem["grads"]}.get(label, 0)


# ---- one rank of a plan at scale (the scale stage) -----------------------------------------------
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
