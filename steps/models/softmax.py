"""Softmax by hand: numerically stable (subtract the row max) with its own backward.

backward: for y = softmax(x), dL/dx = y * (g - sum(g * y)), the Jacobian-vector product
without ever building the (n, n) Jacobian.
"""

from __future__ import annotations

import numpy as np
import torch


def softmax_np(x: np.ndarray, axis: int = -1, mask: np.ndarray | None = None) -> np.ndarray:
    """mask: boolean, True = keep. Masked positions get probability exactly 0."""
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    z = x - np.max(x, axis=axis, keepdims=True)  # exp never overflows: the max becomes exp(0)=1
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor | None = None, dim: int = -1):
        if mask is not None:
            x = x.masked_fill(~mask, float("-inf"))
        z = x - x.amax(dim=dim, keepdim=True)
        e = z.exp()
        y = e / e.sum(dim=dim, keepdim=True)
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        gx = y * (g - (g * y).sum(dim=ctx.dim, keepdim=True))  # masked y=0 -> gradient 0
        return gx, None, None


def softmax(x: torch.Tensor, mask: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """Softmax over `dim`; `mask` (bool, True = keep) broadcasts against x."""
    return Softmax.apply(x, mask, dim)
