"""Position-wise feed-forward: d -> 4d -> GELU -> d.

GPT-2 uses "gelu_new", the tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)));
"gelu" is the exact x·Phi(x). They differ by ~1e-3, enough to break a parity check.
"""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"gelu_new": partial(F.gelu, approximate="tanh"), "gelu": F.gelu}


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        if config.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {config.activation!r}")
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.act = ACTIVATIONS[config.activation]
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))  # (B, T, C) -> (B, T, 4C) -> (B, T, C)
