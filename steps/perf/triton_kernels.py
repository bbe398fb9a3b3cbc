"""Triton kernels for the fused softmax and LayerNorm (CUDA only; imported lazily by fused.py).

One program per row, the whole row in registers (BLOCK = next power of two ≥ row length, fine for
attention rows ≤ 8k and hidden sizes ≤ 8k). Rows are the flattened leading dims; row offsets are
int64 (an int32 row * n_cols wraps past 2**31 elements, e.g. batch 16 x 12 heads x 8k x 8k scores).
The attention mask is (t_q, t_k) (leading dims of size 1 allowed) and broadcast over batch and
heads: row r uses mask row r % t_q. Arithmetic is in fp32, or fp64 for fp64 inputs (the reference
math in fused.py never drops below the input's precision). LayerNorm backward fuses dx; dw/db are
column sums over rows, done by torch on the saved stats.
Importing this module without triton raises ImportError — the caller turns that into a skip.
Tested on CPU under the Triton interpreter (TRITON_INTERPRET=1 set before this module is
imported) and compiled ahead of time for sm_80/sm_90 in tests/test_triton_kernels.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_fwd_kernel(
    x_ptr, y_ptr, mask_ptr, n_cols, t_q, HAS_MASK: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=-float("inf")).to(ACC)
    if HAS_MASK:
        keep = tl.load(mask_ptr + (row % t_q) * n_cols + cols, mask=inside, other=0)
        x = tl.where(keep != 0, x, -float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _softmax_bwd_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, ACC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    y = tl.load(y_ptr + row * n_cols + cols, mask=inside, other=0.0).to(ACC)
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=inside, other=0.0).to(ACC)
    dx = y * (dy - tl.sum(y * dy, axis=0))
    tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _layernorm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    n_cols,
    eps,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0).to(ACC)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(inside, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    y = xc * rstd * tl.load(w_ptr + cols, mask=inside, other=0.0).to(ACC)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=inside, other=0.0).to(ACC)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _layernorm_bwd_dx_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, n_cols, ACC: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0).to(ACC)
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=inside, other=0.0).to(ACC)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(ACC)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(inside, (x - mean) * rstd, 0.0)
    g = dy * w
    dx = rstd * (g - tl.sum(g, axis=0) / n_cols - xhat * tl.sum(g * xhat, axis=0) / n_cols)
    tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)


def _rows(t: torch.Tensor) -> tuple[int, int, int]:
    n = t.shape[-1]
    return t.numel() // n, n, triton.next_power_of_2(n)


def _acc(*ts: torch.Tensor) -> tuple[torch.dtype, tl.dtype]:
    """fp32 arithmetic, fp64 when any input is fp64 (as fused._acc: never below the input)."""
    if any(t.dtype == torch.float64 for t in ts):
        return torch.float64, tl.float64
    return torch.float32, tl.float32


def softmax_fwd(x, mask):
    rows, n, block = _rows(x)
    y = torch.empty_like(x)
    if mask is not None:
        t_q = mask.shape[-2] if mask.dim() >= 2 else 1
        if mask.shape[-1] != n or mask.numel() != t_q * n or (t_q > 1 and x.shape[-2] != t_q):
            raise ValueError(
                f"the Triton softmax takes a (t_q, t_k) mask broadcast over the leading "
                f"dims of x; got mask {tuple(mask.shape)} for x {tuple(x.shape)}"
            )
        m = mask.to(torch.int8).contiguous()
    else:
        t_q, m = 1, x  # dummy pointer, never read
    _softmax_fwd_kernel[(rows,)](x, y, m, n, t_q, HAS_MASK=mask is not None, ACC=_acc(x)[1], BLOCK=block)
    return y


def softmax_bwd(y, dy):
    rows, n, block = _rows(y)
    dx = torch.empty_like(dy)
    _softmax_bwd_kernel[(rows,)](y, dy, dx, n, ACC=_acc(y, dy)[1], BLOCK=block)
    return dx


def layernorm_fwd(x, w, b, eps):
    rows, n, block = _rows(x)
    acc_t, acc = _acc(x)
    y = torch.empty_like(x)
    mean = torch.empty(x.shape[:-1] + (1,), device=x.device, dtype=acc_t)
    rstd = torch.empty_like(mean)
    _layernorm_fwd_kernel[(rows,)](
        x, w, b if b is not None else w, y, mean, rstd, n, eps, HAS_BIAS=b is not None, ACC=acc, BLOCK=block
    )
    return y, mean, rstd


def layernorm_bwd(dy, x, w, mean, rstd):
    rows, n, block = _rows(x)
    acc_t, acc = _acc(dy, x, mean)
    dx = torch.empty_like(dy)
    _layernorm_bwd_dx_kernel[(rows,)](dy, x, w, mean, rstd, dx, n, ACC=acc, BLOCK=block)
    flat = dy.reshape(-1, n).to(acc_t)
    xhat = (x.reshape(-1, n).to(acc_t) - mean.reshape(-1, 1)) * rstd.reshape(-1, 1)
    return dx, (flat * xhat).sum(0).to(w.dtype), flat.sum(0).to(w.dtype)


KERNELS = {
    "softmax_fwd": softmax_fwd,
    "softmax_bwd": softmax_bwd,
    "layernorm_fwd": layernorm_fwd,
    "layernorm_bwd": layernorm_bwd,
}
