"""Where the memory of one GPT training step goes: an analytic model next to measurements.

Analytic (bytes, from GPTConfig alone):
  params      N · 4 (fp32 master weights; autocast keeps them fp32)
  grads       N · 4
  optimizer   N · 8 (AdamW exp_avg + exp_avg_sq; the per-tensor `step` scalars are noise)
  activations what eager autograd saves for backward, per layer and per token (see ACT_* below)
  peak        params + optimizer + saved activations + logits + cross-entropy's two (B, T, V)
              fp32 gradients at the start of backward (grads do not exist yet in a steady step)
The activation gap: the saved set is what "activations" usually means, but it is not the peak:
with vocab 8192 the (B, T, V) logits, log-probs and their gradients outweigh all four layers'
saved tensors; what is left between the analytic peak and the measured one is backward's
short-lived per-op gradients, oneDNN scratch buffers and allocator slack. The model is of
eager PyTorch: torch.compile peaks lower, because AOTAutograd's min-cut partitioner saves fewer
tensors and recomputes cheap elementwise ops in backward.
Measured:
  state       summed bytes of the distinct storages of params, grads and optimizer state (exact)
  saved       bytes of the distinct non-parameter storages autograd saves for backward, counted
              with torch.autograd.graph.saved_tensors_hooks (exact for eager; torch.compile's
              AOTAutograd graph saves its own set, so compiled cells are not counted)
  process     CUDA: allocator stats; CPU: RSS/VmHWM, meaningful only with MALLOC_MMAP_THRESHOLD_
              set low (glibc otherwise keeps freed blocks, so RSS never goes down)
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from steps import hardware
from steps.models.chunked_ce import default_chunk_size

MiB = 2**20

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


def param_counts(cfg) -> dict[str, int]:
    """Parameters by group for a steps.models.gpt.GPTConfig (tied LM head counted once)."""
    d, V, L, b = cfg.n_embd, cfg.vocab_size, cfg.n_layer, int(cfg.bias)
    norm = d * (1 + b) if cfg.norm == "layernorm" else d
    per_layer = 4 * (d * d + b * d) + (d * 4 * d + b * 4 * d) + (4 * d * d + b * d) + 2 * norm
    return {
        "wte": V * d,
        "wpe": cfg.block_size * d if cfg.pos == "learned" else 0,
        "blocks": L * per_layer,
        "ln_f": norm,
        "lm_head": 0 if cfg.tie_weights else V * d,
    }


def analytic_memory(
    cfg,
    batch_size: int,
    amp: str = "none",
    checkpoint: bool = False,
    attn: str = "sdpa",
    optimizer_states: int = 2,
    grad_accum: int = 1,
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
        "optimizer": 4 * optimizer_states * n,
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


def _storage_key(t: torch.Tensor):
    return (t.device, t.untyped_storage().data_ptr())


def _unique_bytes(tensors) -> int:
    seen: dict = {}
    for t in tensors:
        if t is not None:
            seen[_storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def state_bytes(model: torch.nn.Module, optimizer=None) -> dict[str, int]:
    """Measured bytes of params, grads and optimizer state (distinct storages: tied weights once)."""
    params = list(model.parameters())
    opt = [v for s in (optimizer.state.values() if optimizer else []) for v in s.values() if torch.is_tensor(v)]
    out = {
        "params": _unique_bytes(params),
        "grads": _unique_bytes(p.grad for p in params),
        "optimizer": _unique_bytes(opt),
    }
    out["state"] = sum(out.values())
    return out


class SavedTensorMeter:
    """Counts bytes autograd saves for backward (distinct non-parameter storages) while active."""

    def __init__(self, model: torch.nn.Module):
        self.exclude = {_storage_key(p) for p in model.parameters()}
        self.storages: dict = {}

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def reset(self) -> None:
        self.storages.clear()

    def _pack(self, t: torch.Tensor):
        key = _storage_key(t)
        if key not in self.exclude:
            self.storages[key] = t.untyped_storage().nbytes()
        return t

    @contextmanager
    def __call__(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self


class MemoryProbe:
    """Snapshots at named checkpoints. CUDA: allocator stats. CPU: RSS (delta since creation)
    plus tracked tensor bytes (params + grads + optimizer state + saved activations)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.hw = hardware
        self.rss0 = hardware.rss_bytes()
        self.rows: list[dict] = []

    def __call__(
        self, label: str, iteration: int = -1, model=None, optimizer=None, saved: int = 0, analytic: float = math.nan
    ) -> dict:
        row = {"iteration": iteration, "checkpoint": label}
        tracked = (state_bytes(model, optimizer)["state"] if model is not None else 0) + saved
        if self.cuda:
            torch.cuda.synchronize()
            row |= {
                "allocated_mib": torch.cuda.memory_allocated() / MiB,
                "reserved_mib": torch.cuda.memory_reserved() / MiB,
            }
        else:
            row |= {"tensor_mib": tracked / MiB, "rss_delta_mib": (self.hw.rss_bytes() - self.rss0) / MiB}
        row["analytic_mib"] = analytic / MiB
        self.rows.append(row)
        return row


def timeline_analytic(mem: dict, label: str, opt_ready: bool) -> float:
    """Analytic bytes alive at a timeline checkpoint (the seed's mem_usage notebook order)."""
    alive = mem["params"] + (mem["optimizer"] if opt_ready else 0)
    if label.startswith("inside forward"):  # after block i: i blocks' activations saved
        return alive + mem["activations_per_layer"] * int(label.rsplit(" ", 1)[1])
    # tracked tensors after forward: the saved set (the returned logits are not enumerable)
    forward = mem["activations"] + mem["autocast_weights"]
    return alive + {"after forward": forward, "after backward": mem["grads"], "after step": mem["grads"]}.get(label, 0)


def plot_timeline(rows: list[dict]):
    """Line plot of the timeline: measured series next to the analytic one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['iteration']}:{r['checkpoint']}" if r["iteration"] >= 0 else r["checkpoint"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4))
    for key in [k for k in rows[0] if k.endswith("_mib")]:
        ax.plot(range(len(rows)), [r[key] for r in rows], marker="o", label=key.removesuffix("_mib"))
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("MiB")
    ax.set_title("memory timeline of one training step (two iterations)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig
