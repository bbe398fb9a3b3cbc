"""LayerNorm and RMSNorm by hand, with NumPy twins.

LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b      (biased variance, like torch and GPT-2)
RMSNorm:   y = x / sqrt(mean(x^2) + eps) * w             (no centring, no bias: Llama, T5)

Both backwards use the normalised x̂ and rstd = 1/sqrt(...) saved in forward:
  LayerNorm: dx = rstd * (ĝ - mean(ĝ) - x̂ * mean(ĝ x̂)),  ĝ = g * w
  RMSNorm:   dx = rstd * (ĝ - x̂ * mean(ĝ x̂))
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def layer_norm_np(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rms_norm_np(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _sum_leading(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).sum(0)


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps=1e-5):
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        rstd = (var + eps).rsqrt()
        xhat = (x - mu) * rstd
        ctx.save_for_backward(xhat, rstd, w)
        ctx.has_bias = b is not None
        return xhat * w + b if b is not None else xhat * w

    @staticmethod
    def backward(ctx, g):
        xhat, rstd, w = ctx.saved_tensors
        gh = g * w
        gx = rstd * (gh - gh.mean(-1, keepdim=True) - xhat * (gh * xhat).mean(-1, keepdim=True))
        return gx, _sum_leading(g * xhat), _sum_leading(g) if ctx.has_bias else None, None


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps=1e-6):
        rstd = (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
        xhat = x * rstd
        ctx.save_for_backward(xhat, rstd, w)
        return xhat * w

    @staticmethod
    def backward(ctx, g):
        xhat, rstd, w = ctx.saved_tensors
        gh = g * w
        gx = rstd * (gh - xhat * (gh * xhat).mean(-1, keepdim=True))
        return gx, _sum_leading(g * xhat), None


def layer_norm(x, w, b, eps=1e-5):
    return LayerNormFunction.apply(x, w, b, eps)


def rms_norm(x, w, eps=1e-6):
    return RMSNormFunction.apply(x, w, eps)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm computed by LayerNormFunction (same parameters and state dict)."""

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm computed by RMSNormFunction (same parameters and state dict)."""

    def forward(self, x):
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return rms_norm(x, self.weight, eps)


def make_norm(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    """The fast torch module for `kind`; use_custom_functions() swaps in the classes above."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")
