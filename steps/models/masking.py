"""Attention masks in NumPy. Convention: boolean, True = may attend; shape (..., T_q, T_k).

An additive mask (0 / -inf) is `np.where(mask, 0, -inf)`; HF adds the dtype's min instead of
-inf so that fully masked rows (padding queries) stay finite.
"""

from __future__ import annotations

import numpy as np


def causal_mask(t_q: int, t_k: int | None = None) -> np.ndarray:
    """Query i (the last t_q of t_k positions) sees keys 0..i+offset: bottom-right aligned,
    which is what a KV cache needs (t_q new tokens after t_k - t_q cached ones)."""
    t_k = t_q if t_k is None else t_k
    return np.tril(np.ones((t_q, t_k), dtype=bool), k=t_k - t_q)


def padding_mask(lengths, t: int) -> np.ndarray:
    """(B, 1, t) key mask: True for real tokens of each sequence (right padding)."""
    lengths = np.asarray(lengths)
    return (np.arange(t)[None, :] < lengths[:, None])[:, None, :]


def combined_mask(lengths, t: int) -> np.ndarray:
    """(B, t, t): causal AND key-is-not-padding."""
    return causal_mask(t)[None] & padding_mask(lengths, t)


def additive(mask: np.ndarray, dtype=np.float32) -> np.ndarray:
    return np.where(mask, 0.0, -np.inf).astype(dtype)
