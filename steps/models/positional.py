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
    pos = np.arange(n_pos)[:, None]
    inv = base ** (-np.arange(0, d, 2) / d)
    pe = np.zeros((n_pos, d))
    pe[:, 0::2] = np.sin(pos * inv)
    pe[:, 1::2] = np.cos(pos * inv)[:, : d // 2]
    return pe


def sinusoidal(n_pos: int, d: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(n_pos, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)[:, : d // 2]
    return pe.to(dtype)


def rope_angles_np(n_pos: int, d: int, base: float = 10000.0, offset: int = 0) -> np.ndarray:
    """(n_pos, d/2) angles pos * theta_i."""
    return np.arange(offset, offset + n_pos)[:, None] * base ** (-np.arange(0, d, 2) / d)


def rope_interleaved_np(x: np.ndarray, base: float = 10000.0, offset: int = 0) -> np.ndarray:
    """x: (..., T, d). Rotate pairs (x[2i], x[2i+1])."""
    a = rope_angles_np(x.shape[-2], x.shape[-1], base, offset)
    cos, sin = np.cos(a), np.sin(a)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


def rope_neox_np(x: np.ndarray, base: float = 10000.0, offset: int = 0) -> np.ndarray:
    """x: (..., T, d). Rotate pairs (x[i], x[i + d/2])."""
    h = x.shape[-1] // 2
    a = rope_angles_np(x.shape[-2], x.shape[-1], base, offset)
    cos, sin = np.cos(a), np.sin(a)
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def rope_cos_sin(n_pos: int, d: int, base: float = 10000.0, dtype=torch.float32, device=None):
    """cos/sin tables of shape (n_pos, d/2), computed in float64 then cast (exact for fp64 parity)."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
    a = torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv
    return a.cos().to(dtype), a.sin().to(dtype)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (..., T, d); cos/sin: (T, d/2) for exactly x's positions."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
