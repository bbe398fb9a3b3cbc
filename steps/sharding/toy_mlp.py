"""The toy model every from-scratch strategy shards: L residual blocks x + W2·relu(W1·x + b1) + b2.

Weights come from numpy (toy_mlp_init.py) so torch and JAX start from exactly the same numbers.
Per block: W1 (hidden, dim), b1 (hidden), W2 (dim, hidden), b2 (dim) — the Megatron MLP shape:
W1 is split on its output rows (column-parallel), W2 on its input columns (row-parallel).
Every (sharded) MLP is a Stack of blocks with the same two methods: train_step(x, y) and
full_state(kind).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from steps.sharding.toy_mlp_init import PARAM_NAMES


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)


def block(x, w1, b1, w2, b2):
    return x + F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


class Block(nn.Module):
    def __init__(self, w1, b1, w2, b2):
        super().__init__()
        self.w1, self.b1, self.w2, self.b2 = (nn.Parameter(t) for t in (w1, b1, w2, b2))

    def forward(self, x):
        return block(x, self.w1, self.b1, self.w2, self.b2)


def n_blocks(full: dict) -> int:
    return len({k.split(".")[0] for k in full})


class Stack(nn.Module):
    """Blocks run in order: the skeleton every (sharded) MLP shares; only the blocks differ."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and backward on this rank's rows; returns the loss."""
        loss = loss_fn(self(x), y)
        loss.backward()
        return loss.detach()


class MLP(Stack):
    """The single-device reference (also what DP and PP hold a full or partial copy of)."""

    def __init__(self, full: dict[str, torch.Tensor], layers: range | None = None):
        ids = list(layers if layers is not None else range(n_blocks(full)))
        super().__init__(Block(*(full[f"{i}.{p}"].clone() for p in PARAM_NAMES)) for i in ids)
        self.ids = ids

    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """This module's tensors under the global names ('param' or 'grad')."""
        out = {}
        for i, b in zip(self.ids, self.blocks):
            for p in PARAM_NAMES:
                t = getattr(b, p)
                out[f"{i}.{p}"] = (t if kind == "param" else t.grad).detach()
        return out
