"""Triton kernels for the fused softmax and LayerNorm (CUDA only; imported lazily by fused.py).

One program per row, the whole row in registers (BLOCK = next power of two ≥ row length, fine for
attention rows ≤ 8k and hidden sizes ≤ 8k). Rows are the flattened leading dims. The attention
mask is 2-D (t_q, t_k) and broadcast over batch and heads: row r uses mask row r % t_q.
LayerNorm backward fuses dx; dw/db are column sums over rows, done by torch on the saved stats.
Importing this module without triton raises ImportError — the caller turns that into a skip.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_fwd_kernel(x_ptr, y_ptr, mask_ptr, n_cols, t_q, HAS_MASK: tl.constexpr,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=-float("inf")).to(tl.float32)
    if HAS_MASK:
        keep = tl.load(mask_ptr + (row % t_q) * n_cols + cols, mask=inside, other=0)
        x = tl.where(keep != 0, x, -float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _softmax_bwd_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    y = tl.load(y_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    dx = y * (dy - tl.sum(y * dy, axis=0))
    tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _layernorm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps,
                          HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(inside, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    y = xc * rstd * tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _layernorm_bwd_dx_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, n_cols,
                             BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(inside, (x - mean) * rstd, 0.0)
    g = dy * w
    dx = rstd * (g - tl.sum(g, axis=0) / n_cols - xhat * tl.sum(g * xhat, axis=0) / n_cols)
    tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)


def _rows(t: torch.Tensor) -> tuple[int, int, int]:
    n = t.shape[-1]
    return t.numel() // n, n, triton.next_power_of_2(n)


def softmax_fwd(x, mask):
    rows, n, block = _rows(x)
    y = torch.empty_like(x)
    m = mask.to(torch.int8).contiguous() if mask is not None else x  # dummy pointer if no mask
    t_q = mask.shape[-2] if mask is not None else 1
    _softmax_fwd_kernel[(rows,)](x, y, m, n, t_q, HAS_MASK=mask is not None, BLOCK=block)
    return y


def softmax_bwd(y, dy):
    rows, n, block = _rows(y)
    dx = torch.empty_like(dy)
    _softmax_bwd_kernel[(rows,)](y, dy, dx, n, BLOCK=block)
    return dx


def layernorm_fwd(x, w, b, eps):
    rows, n, block = _rows(x)
    y = torch.empty_like(x)
    mean = torch.empty(x.shape[:-1] + (1,), device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    _layernorm_fwd_kernel[(rows,)](x, w, b if b is not None else w, y, mean, rstd, n, eps,
                                   HAS_BIAS=b is not None, BLOCK=block)
    return y, mean, rstd


def layernorm_bwd(dy, x, w, mean, rstd):
    rows, n, block = _rows(x)
    dx = torch.empty_like(dy)
    _layernorm_bwd_dx_kernel[(rows,)](dy, x, w, mean, rstd, dx, n, BLOCK=block)
    flat = dy.reshape(-1, n).float()
    xhat = (x.reshape(-1, n).float() - mean.reshape(-1, 1)) * rstd.reshape(-1, 1)
    return dx, (flat * xhat).sum(0).to(w.dtype), flat.sum(0).to(w.dtype)


KERNELS = {"softmax_fwd": softmax_fwd, "softmax_bwd": softmax_bwd,
           "layernorm_fwd": layernorm_fwd, "layernorm_bwd": layernorm_bwd}
