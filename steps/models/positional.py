"""Positional information: sinusoidal table (Vaswani et al.), RoPE in two layouts.

RoPE rotates each 2-D pair of a query/key vector by angle pos * theta_i, theta_i = base^(-2i/d),
so q·k depends only on the distance between positions. The pairs can be chosen two ways:
- interleaved (GPT-J, the RoFormer paper): pairs (x0,x1), (x2,x3), ...
- NeoX / rotate-half (GPT-NeoX, Llama): pairs (x_i, x_{i+d/2}).
Same maths, different memory layout; weights trained with one are not usable with the other.
"""

from __future__ import annotations

import numpy as np
import torch


def sinusoidal_np(n_pos: int, d: int, base: float = 10000.0) -> np.ndarray:
    """PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(...)."""
    pos = np.arange(n_pos)[:, None]  # (n_pos, 1)
    inv = base ** (-np.arange(0, d, 2) / d)  # (⌈d/2⌉,)
    pe = np.zeros((n_pos, d))  # (n_pos, d)
    pe[:, 0::2] = np.sin(pos * inv)  # even columns (n_pos, ⌈d/2⌉)
    pe[:, 1::2] = np.cos(pos * inv)[:, : d // 2]  # odd columns (n_pos, ⌊d/2⌋)
    return pe


def sinusoidal(n_pos: int, d: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]  # (n_pos, 1)
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (⌈d/2⌉,)
    pe = torch.zeros(n_pos, d, dtype=torch.float64)  # (n_pos, d)
    pe[:, 0::2] = torch.sin(pos * inv)  # even columns (n_pos, ⌈d/2⌉)
    pe[:, 1::2] = torch.cos(pos * inv)[:, : d // 2]  # odd columns (n_pos, ⌊d/2⌋)
    return pe.to(dtype)  # (n_pos, d)


def rope_angles_np(n_pos: int, d: int, base: float = 10000.0, offset: int = 0) -> np.ndarray:
    """(n_pos, d/2) angles pos * theta_i."""
    return np.arange(offset, offset + n_pos)[:, None] * base ** (-np.arange(0, d, 2) / d)  # (n_pos, d/2)


def rope_interleaved_np(x: np.ndarray, base: float = 10000.0, offset: int = 0) -> np.ndarray:
    """x: (..., T, d). Rotate pairs (x[2i], x[2i+1])."""
    a = rope_angles_np(x.shape[-2], x.shape[-1], base, offset)  # (T, d/2)
    cos, sin = np.cos(a), np.sin(a)  # (T, d/2) each
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) each
    out = np.empty_like(x)  # (..., T, d)
    out[..., 0::2] = x1 * cos - x2 * sin  # even columns (..., T, d/2)
    out[..., 1::2] = x1 * sin + x2 * cos  # odd columns (..., T, d/2)
    return out


def rope_neox_np(x: np.ndarray, base: float = 10000.0, offset: int = 0) -> np.ndarray:
    """x: (..., T, d). Rotate pairs (x[i], x[i + d/2])."""
    h = x.shape[-1] // 2  # d/2
    a = rope_angles_np(x.shape[-2], x.shape[-1], base, offset)  # (T, d/2)
    cos, sin = np.cos(a), np.sin(a)  # (T, d/2) each
    x1, x2 = x[..., :h], x[..., h:]  # (..., T, d/2) each
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)  # (..., T, d)


def rope_cos_sin(n_pos: int, d: int, base: float = 10000.0, dtype=torch.float32, device=None):
    """cos/sin tables of shape (n_pos, d/2), computed in float64 then cast (exact for fp64 parity)."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)  # (d/2,)
    a = torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv  # (n_pos, d/2)
    return a.cos().to(dtype), a.sin().to(dtype)  # (n_pos, d/2) each


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (..., T, d); cos/sin: (T, d/2) for exactly x's positions."""
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) each
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)  # (..., T, d)


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2  # d/2
    x1, x2 = x[..., :h], x[..., h:]  # (..., T, d/2) each
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., T, d)
