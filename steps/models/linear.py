"""Linear projection y = x W^T + b by hand (PyTorch's nn.Linear layout: W is (out, in)).

backward: dx = g W, dW = g^T x (summed over all leading dims), db = sum(g).
HF GPT-2 stores the same map as Conv1D with W^T, (in, out) — see hf_convert.py.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def linear_np(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = x @ w.T
    return y if b is None else y + b


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b=None):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        y = x @ w.t()
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        gx = g @ w
        gw = g2.t() @ x2
        gb = g2.sum(0) if ctx.has_bias else None
        return gx, gw, gb


def linear(x, w, b=None):
    return LinearFunction.apply(x, w, b)


class Linear(nn.Linear):
    """nn.Linear with the hand-written Function: same parameters, same state dict."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)
