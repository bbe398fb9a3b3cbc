"""Chunked linear + cross-entropy: the LM-head loss without the (B·T, V) fp32 logits.

The unfused head is two ops, and autograd keeps their big intermediate alive:
    logits = h @ Wᵀ                      (N, V) in the compute dtype, returned to the caller
    loss   = cross_entropy(logits.float(), t)
cross-entropy saves its fp32 log-probs (N, V) for backward, and backward then holds two more
(N, V) fp32 tensors (the gradient of the log-probs and of the logits). With N = B·T tokens and
a real vocabulary these dwarf the other activations (GPT-2: V = 50257, so 8 × 1024 tokens of
fp32 logits are 1.5 GiB, and cross-entropy's backward holds three such tensors at once).

The trick (Liger Kernel's fused linear cross-entropy; Apple's "Cut Your Losses" goes further and
never writes even one chunk to memory): the gradient of the mean cross-entropy w.r.t. the
logits of row i is known in closed form as soon as the row's logits are,
    ∂loss/∂z_i = (softmax(z_i) − onehot(t_i)) / n_valid        (0 for rows with t_i = ignore)
so walk over chunks of C rows, and for each chunk
    z   = h_c @ Wᵀ                        (C, V) compute dtype (bf16 under autocast)
    lse = logsumexp(z.float())           fp32: the loss of row i is lse_i − z_i[t_i]
    g   = (exp(z − lse) − onehot) / n    (C, V) fp32, in place over z.float()
    grad_h[c] = g @ W                    (C, d)
    grad_W   += gᵀ @ h_c                 (V, d)
and throw z and g away. Backward has nothing left to do but multiply the two stored gradients
by the incoming scalar grad_output. What autograd saves is grad_h (N, d) and grad_W (V, d): the
size of the input and the weight, never N × V; the largest transient tensor is (C, V).

Costs: the gradients are computed in forward even if nobody calls backward (so use it for
training only; with grad disabled the loop computes the loss alone), and W is read from memory
once per chunk instead of once: the logits matmul does 2·C·d·V flops per 2·d·V bytes of bf16
weight read, an arithmetic intensity of ≈ C flop/byte, so small chunks turn it memory-bound on
a GPU (an H100's bf16 ridge is ~300 flop/byte). That sets the default chunk size below.

Dtypes: under torch.autocast the two matmuls of each chunk run in the autocast dtype (as
F.linear would), the softmax, logsumexp and loss in fp32 (as `logits.float()` in
causal_lm_loss does), grad_W is accumulated over chunks in fp32 (the weight's dtype), and the
returned gradients have their inputs' dtypes. Without autocast everything runs in the inputs'
dtype, fp32 at least for the softmax; fp64 inputs stay fp64 end to end (the parity tests).

All targets ignored: like F.cross_entropy(reduction="mean") the loss is 0/0 = nan, and the
gradients are zero (no row contributes). n_valid stays a tensor, so there is no host sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MiB = 2**20

# Default chunk: the largest power of two of rows whose fp32 logits fit CHUNK_BYTES (16 MiB),
# but at least MIN_CHUNK_ROWS (256) rows. 16 MiB keeps the transient (C, V) buffers (the fp32
# logits/softmax, logsumexp's internal exp, the bf16 copies of z and g under autocast: about
# 2 × CHUNK_BYTES at once) small next to a training step, and splits the perf matrix's head
# (V = 8192: 512 rows, so 2 chunks of its 1024 tokens) so the full logits never exist. The
# 256-row floor is the arithmetic intensity argument above: below it, re-reading W per chunk dominates on a GPU (GPT-2's
# V = 50257 would give 64 rows from the budget alone; 256 rows are 49 MiB of fp32 per chunk,
# 1/18 of the full logits of configs/gpu.yaml's perf batch, 36 × 128 tokens).
CHUNK_BYTES = 16 * MiB
MIN_CHUNK_ROWS = 256


def default_chunk_size(n_rows: int, vocab: int, chunk_bytes: int = CHUNK_BYTES, min_rows: int = MIN_CHUNK_ROWS) -> int:
    """Rows per chunk: pow2 ≤ chunk_bytes / (4·V), at least min_rows, at most n_rows."""
    rows = max(1, chunk_bytes // (4 * vocab))
    rows = max(1 << (rows.bit_length() - 1), min_rows)
    return max(1, min(rows, n_rows))


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The matmul dtype F.linear would use here: autocast's dtype if autocast is on (fp64 is left
    alone, as autocast does), else the promoted input dtype."""
    dtype = torch.promote_types(hidden.dtype, weight.dtype)
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev) and dtype != torch.float64:
        return torch.get_autocast_dtype(dev)
    return dtype


def _chunked_loss_and_grads(
    hidden,
    weight,
    targets,
    ignore_index: int,
    chunk_size: int,
    compute_dtype: torch.dtype,
    need_grad_h: bool,
    need_grad_w: bool,
):
    """The loop. hidden (N, d), weight (V, d), targets (N,). Returns (loss, grad_h, grad_w);
    the gradients are of the mean loss (grad_output = 1), None where not needed."""
    acc = torch.float64 if compute_dtype == torch.float64 else torch.float32  # softmax dtype
    n = hidden.shape[0]  # N rows
    valid = targets != ignore_index  # (N,) bool
    n_valid = valid.sum()  # a tensor: no host sync
    # per-row gradient scale: 1/n_valid for scored rows, 0 for ignored ones (and all-ignored)
    row_scale = valid.to(acc) / n_valid.clamp(min=1).to(acc)  # (N,)
    safe_t = torch.where(valid, targets, torch.zeros_like(targets))  # (N,); ignore_index may be < 0
    w = weight.to(compute_dtype)  # (V, d); one low-precision copy under autocast, as F.linear
    total = torch.zeros((), dtype=acc, device=hidden.device)  # scalar
    grad_h = torch.empty_like(hidden) if need_grad_h else None  # (N, d)
    grad_w = torch.zeros_like(weight, dtype=torch.promote_types(weight.dtype, acc)) if need_grad_w else None  # (V, d)
    for s in range(0, n, chunk_size):
        h = hidden[s : s + chunk_size].to(compute_dtype)  # (C, d)
        t, scale = safe_t[s : s + chunk_size], row_scale[s : s + chunk_size]  # (C,) each
        z = h @ w.T  # (C, V) compute dtype
        zf = z.to(acc)  # (C, V) fp32 (the same tensor if z is)
        del z
        lse = torch.logsumexp(zf, dim=-1)  # (C,)
        z_t = zf.gather(1, t[:, None]).squeeze(1)  # (C,)
        total = total + ((lse - z_t) * valid[s : s + chunk_size]).sum()  # scalar
        if not (need_grad_h or need_grad_w):
            continue
        g = zf.sub_(lse[:, None]).exp_()  # (C, V) softmax, in place over zf
        g[torch.arange(g.shape[0], device=g.device), t] -= 1.0  # − onehot
        g.mul_(scale[:, None])  # (C, V) / n_valid; ignored rows -> 0
        gc = g.to(compute_dtype)  # (C, V)
        del g, zf
        if need_grad_h:
            grad_h[s : s + chunk_size] = gc @ w  # (C, V) @ (V, d) -> (C, d)
        if need_grad_w:
            grad_w += gc.T @ h  # (V, C) @ (C, d) -> (V, d), in fp32 (or fp64)
        del gc
    loss = total / n_valid.to(acc)  # scalar; 0/0 = nan if all are ignored
    return loss, grad_h, None if grad_w is None else grad_w.to(weight.dtype)


class LinearCrossEntropy(torch.autograd.Function):
    """loss = mean CE(hidden @ weightᵀ, targets); gradients computed in forward, chunk by chunk.

    Saves grad_hidden (N, d) and grad_weight (V, d) — nothing of size N × V."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, chunk_size, compute_dtype):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # autocast stays on inside a Function's forward: turn it off, the dtypes are explicit
        with torch.autocast(hidden.device.type, enabled=False):
            loss, grad_h, grad_w = _chunked_loss_and_grads(
                hidden, weight, targets, ignore_index, chunk_size, compute_dtype, need_h, need_w
            )
        ctx.save_for_backward(grad_h, grad_w)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_h, grad_w = ctx.saved_tensors
        # the loss is a scalar: the chain rule is a scale (grad_output is 1 for loss.backward())
        gh = None if grad_h is None else grad_h * grad_output.to(grad_h.dtype)  # (N, d)
        gw = None if grad_w is None else grad_w * grad_output.to(grad_w.dtype)  # (V, d)
        return gh, gw, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `targets`, over the non-ignored targets,
    without materialising the full logits: = F.cross_entropy(F.linear(hidden, weight).float(),
    targets, ignore_index=ignore_index) (see reference_linear_cross_entropy).

    hidden (..., d) and targets (...) are flattened to (N, d) and (N,); weight is (V, d) (an
    nn.Linear's weight, tied to an embedding or not; it may not require grad). chunk_size rows
    per chunk; None/0 picks default_chunk_size(N, V). With grad disabled, or when neither input
    requires grad, the loss is computed chunk by chunk with no gradient work at all."""
    d = hidden.shape[-1]  # hidden (..., d)
    hidden, targets = hidden.reshape(-1, d), targets.reshape(-1)  # (N, d), (N,)
    if targets.shape[0] != hidden.shape[0]:
        raise ValueError(f"{hidden.shape[0]} rows of hidden but {targets.shape[0]} targets")
    if weight.dim() != 2 or weight.shape[1] != d:
        raise ValueError(f"weight must be (V, {d}), got {tuple(weight.shape)}")
    n = hidden.shape[0]
    chunk = int(chunk_size) if chunk_size else default_chunk_size(n, weight.shape[0])
    if chunk < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    dtype = _compute_dtype(hidden, weight)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return LinearCrossEntropy.apply(hidden, weight, targets, ignore_index, chunk, dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        return _chunked_loss_and_grads(hidden, weight, targets, ignore_index, chunk, dtype, False, False)[0]


def reference_linear_cross_entropy(hidden, weight, targets, ignore_index: int = -100):
    """The unfused twin (what causal_lm_loss computes after the LM head): full fp32 logits."""
    d = hidden.shape[-1]
    logits = F.linear(hidden.reshape(-1, d), weight)  # (N, V)
    return F.cross_entropy(
        logits.float() if logits.dtype != torch.float64 else logits,  # fp32 (N, V) vs (N,)
        targets.reshape(-1),
        ignore_index=ignore_index,
    )  # -> scalar
