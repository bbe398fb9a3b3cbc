"""Fused masked softmax and fused LayerNorm, lightseq-style: one kernel per direction.

The unfused ops (steps/models/softmax.py, nn.LayerNorm-as-autograd) launch one kernel per
elementwise op and keep the intermediates alive; a fused kernel reads the input once, writes the
output once and saves only what backward needs:
  softmax:   save y;                 dx = y * (dy - sum(dy * y))
  LayerNorm: save x, mean, rstd;     dx = rstd * (ĝ - mean(ĝ) - x̂ mean(ĝ x̂)), ĝ = dy * w

Backends (the same autograd.Function, different kernels behind it):
  "triton"   - hand-written Triton kernels (CUDA only, steps/perf/triton_kernels.py, imported lazily)
  "compiled" - the reference math below through torch.compile (inductor generates one fused C++
               loop per function on CPU): the CPU stand-in for the Triton kernels
  "eager"    - the reference math itself, unfused; used by the fast unit tests
  "auto"     - triton on CUDA when triton is importable, else compiled
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from steps.models.attention import CausalSelfAttention

BACKENDS = ("auto", "triton", "compiled", "eager")


# ---- reference math (what every backend must compute) ------------------------------------------
def _acc(t: torch.Tensor) -> torch.Tensor:
    """Accumulate in fp32 at least (bf16/fp16 inputs), never below the input's precision."""
    return t.float() if t.element_size() < 4 else t


def softmax_fwd(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Row softmax of x with mask (bool, True = keep, broadcast over leading dims), fp32 inside."""
    xf = _acc(x)
    if mask is not None:
        xf = xf.masked_fill(~mask, float("-inf"))
    return torch.softmax(xf, dim=-1).to(x.dtype)


def softmax_bwd(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    yf, dyf = _acc(y), _acc(dy)
    return (yf * (dyf - (dyf * yf).sum(-1, keepdim=True))).to(dy.dtype)


def layernorm_fwd(x, w, b, eps: float):
    """Returns y, mean, rstd (mean/rstd ≥ fp32, one per row: all backward needs besides x, w)."""
    xf = _acc(x)
    mean = xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
    y = (xf - mean) * rstd * _acc(w)
    if b is not None:
        y = y + _acc(b)
    return y.to(x.dtype), mean, rstd


def layernorm_bwd(dy, x, w, mean, rstd):
    """Returns dx, dw, db (db always computed; dropped by the caller when there is no bias)."""
    xhat = (_acc(x) - mean) * rstd
    dyf = _acc(dy)
    g = dyf * _acc(w)
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    rows = dyf.reshape(-1, dyf.shape[-1])
    dw = (rows * xhat.reshape(rows.shape)).sum(0)
    db = rows.sum(0)
    return dx.to(dy.dtype), dw.to(w.dtype), db.to(w.dtype)


# ---- backend selection ------------------------------------------------------------------------
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolve_backend(backend: str, device: torch.device | str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"fused backend must be one of {BACKENDS}, got {backend!r}")
    is_cuda = torch.device(device).type == "cuda"
    if backend == "auto":
        return "triton" if is_cuda and triton_available() else "compiled"
    if backend == "triton" and not (is_cuda and triton_available()):
        raise RuntimeError("the triton backend needs CUDA and the triton package")
    return backend


@functools.cache
def _kernels(backend: str) -> dict:
    """name -> callable for one backend; compiled lazily, once per process."""
    ref = {
        "softmax_fwd": softmax_fwd,
        "softmax_bwd": softmax_bwd,
        "layernorm_fwd": layernorm_fwd,
        "layernorm_bwd": layernorm_bwd,
    }
    if backend == "eager":
        return ref
    if backend == "compiled":
        return {k: torch.compile(f, dynamic=False) for k, f in ref.items()}
    if backend == "triton":
        from steps.perf import triton_kernels

        return triton_kernels.KERNELS
    raise ValueError(f"unknown backend {backend!r}")


# ---- autograd Functions -----------------------------------------------------------------------
class FusedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, backend):
        k = _kernels(backend)
        y = k["softmax_fwd"](x.contiguous(), mask)
        ctx.save_for_backward(y)
        ctx.backend = backend
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _kernels(ctx.backend)["softmax_bwd"](y, dy.contiguous()), None, None


class FusedLayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps, backend):
        x = x.contiguous()  # the kernels index rows of a dense last dimension
        y, mean, rstd = _kernels(backend)["layernorm_fwd"](x, w, b, eps)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.backend, ctx.has_bias = backend, b is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = _kernels(ctx.backend)["layernorm_bwd"](dy.contiguous(), x, w, mean, rstd)
        return dx, dw, db if ctx.has_bias else None, None, None


def fused_softmax(x, mask=None, dim: int = -1, backend: str = "auto"):
    """Drop-in for steps.models.softmax.softmax (same (x, mask, dim) signature, last dim only)."""
    if dim not in (-1, x.dim() - 1):
        raise ValueError("fused softmax works on the last dimension")
    return FusedSoftmax.apply(x, mask, resolve_backend(backend, x.device))


class FusedLayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose forward/backward are one fused kernel each (same parameters)."""

    backend = "auto"

    def forward(self, x):
        return FusedLayerNormFunction.apply(
            x, self.weight, self.bias, self.eps, resolve_backend(self.backend, x.device)
        )


def fuse_model(model: nn.Module, softmax: bool, layernorm: bool, backend: str = "auto") -> dict:
    """Swap fused kernels into a GPTLMHeadModel in place; returns how many modules changed.

    Softmax: attention modules expose `softmax` (used by the manual path) — sdpa does not use it,
    so asking for a fused softmax on an sdpa model is an error rather than a silent no-op."""
    counts = {"softmax": 0, "layernorm": 0}
    for m in model.modules():
        if softmax and isinstance(m, CausalSelfAttention):
            if m.impl != "manual":
                raise ValueError("fused_softmax replaces the manual attention softmax: set attn: manual")
            m.softmax = functools.partial(fused_softmax, backend=backend)
            counts["softmax"] += 1
        if layernorm and type(m) is nn.LayerNorm:
            m.__class__ = FusedLayerNorm
            m.backend = backend
            counts["layernorm"] += 1
    return counts
