"""Weights and batches of the toy MLP in numpy (float64): torch and JAX start from the same numbers
without JAX importing torch. Per block: W1 (hidden, dim), b1 (hidden), W2 (dim, hidden), b2 (dim).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

PARAM_NAMES = ("w1", "b1", "w2", "b2")


def init_mlp(dim: int, hidden: int, layers: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(layers):
        out[f"{i}.w1"] = rng.normal(0, dim**-0.5, (hidden, dim))
        out[f"{i}.b1"] = rng.normal(0, 0.02, hidden)
        # GPT-2's residual scaling keeps the output (and the loss) O(1) however deep the stack
        out[f"{i}.w2"] = rng.normal(0, hidden**-0.5 / (2 * layers) ** 0.5, (dim, hidden))
        out[f"{i}.b2"] = rng.normal(0, 0.02, dim)
    return out


def make_batch(batch: int, dim: int, seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of step `step` (same on every rank; each rank slices its share)."""
    rng = np.random.default_rng([seed, step])
    x = rng.normal(size=(batch, dim))
    return x, np.tanh(x[:, ::-1].copy())


def init_plan_mlp(plan) -> dict[str, np.ndarray]:
    """init_mlp of a sharding Plan: its mlp section's sizes and its seed."""
    return init_mlp(**asdict(plan.mlp), seed=plan.seed)
