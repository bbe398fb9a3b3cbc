"""Functions of tensors built from the engine's ops: the losses and activations GPT-2 needs."""

from __future__ import annotations

import math

import numpy as np

from .tensor import Tensor, as_ids, tensor


def logsumexp(x: Tensor, dim: int) -> Tensor:
    """log(sum(exp(x), dim)) without overflow: the row max (a constant: its gradient cancels) first."""
    m = x.max(dim, keepdim=True).detach()
    return ((x - m).exp().sum(dim, keepdim=True).log() + m).view(
        *(s for k, s in enumerate(x.shape) if k != dim % x.dims)
    )


def softmax(x: Tensor, dim: int) -> Tensor:
    m = x.max(dim, keepdim=True).detach()
    e = (x - m).exp()
    return e / e.sum(dim, keepdim=True)


def one_hot(indices, num_classes: int, backend="reference") -> Tensor:
    """(N,) integer classes (a Tensor, an array, a list) -> (N, num_classes) constant of 0/1."""
    indices = as_ids(indices, "one_hot: indices").reshape(-1)
    if indices.size and (indices.min() < 0 or indices.max() >= num_classes):
        raise ValueError(f"one_hot: class ids must lie in [0, {num_classes}), got {indices.min()}..{indices.max()}")
    out = np.zeros((indices.size, num_classes))
    out[np.arange(indices.size), indices] = 1.0
    return tensor(out, backend=backend)


def softmax_loss(logits: Tensor, targets) -> Tensor:
    """Per-row cross-entropy: (N, C) logits, (N,) class ids (a Tensor, an array, a list) -> (N,) =
    logsumexp - logit of the target."""
    n, c = logits.shape
    targets = as_ids(targets, "softmax_loss: targets").reshape(-1)
    if targets.size != n:
        raise ValueError(f"softmax_loss: targets: {targets.size} class ids for {n} rows of logits")
    picked = (logits * one_hot(targets, c, logits.backend)).sum(1)  # (N,)
    return logsumexp(logits, 1) - picked


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x): exact with erf ("none", torch's default), or GPT-2's tanh form ("tanh", gelu_new)."""
    if approximate == "none":
        return x * 0.5 * ((x * (1.0 / math.sqrt(2.0))).erf() + 1.0)
    if approximate == "tanh":
        return x * 0.5 * (((x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)).tanh() + 1.0)
    raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")


_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seed dropout's masks (NumPy's generator: the masks differ from torch's)."""
    global _rng
    _rng = np.random.default_rng(seed)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability p, scale the rest by 1/(1-p)."""
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must lie in [0, 1), got {p}")
    keep = (_rng.random(x.shape) >= p) / (1.0 - p)
    return x * tensor(keep, backend=x.backend)
