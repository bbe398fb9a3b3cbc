"""Models on the engine: assignment 1's feed-forward classifier and assignment 2's decoder-only GPT-2.

The GPT mirrors steps/models/gpt.py (pre-LN blocks, learned positions, q/k/v/o projections, GELU
MLP, LM head tied to the token embedding) with the same parameter names, so `from_torch` copies a
torch GPTLMHeadModel's weights in and `torch_name` names each of our gradients by torch's.

Shape letters as in steps/models/gpt.py: B batch, T positions, C = n_embd, V vocabulary, nh heads,
hs = C / nh head size.
"""

from __future__ import annotations

import math

import numpy as np

from . import nn
from .module import Dropout, Embedding, LayerNorm1d, Linear, Module, ModuleList
from .tensor import Tensor, as_ids, tensor


class Classifier(Module):
    """Bag of tokens -> Linear -> ReLU -> Dropout -> Linear -> class logits (assignment 1's network)."""

    def __init__(
        self, n_features: int, hidden: int, n_classes: int, dropout: float = 0.1, backend="reference", rng=None
    ):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.l1 = Linear(n_features, hidden, backend=backend, rng=rng)
        self.drop = Dropout(dropout)
        self.l2 = Linear(hidden, n_classes, backend=backend, rng=rng)

    def forward(self, x: Tensor) -> Tensor:  # (N, F) -> (N, classes)
        return self.l2(self.drop(self.l1(x).relu()))


class MultiHeadAttention(Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, backend):
        super().__init__()
        self.n_head, self.head_size = n_head, n_embd // n_head
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, Linear(n_embd, n_embd, backend=backend))
        self.resid_drop = Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        B, T, C = x.shape

        def heads(proj):  # (B, T, C) -> (B, nh, T, hs)
            return proj(x).view(B, T, self.n_head, self.head_size).permute(0, 2, 1, 3)

        q, k, v = heads(self.q_proj), heads(self.k_proj), heads(self.v_proj)
        att = q @ k.permute(0, 1, 3, 2) * (1.0 / math.sqrt(self.head_size)) + mask  # (B, nh, T, T)
        y = nn.softmax(att, -1) @ v  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.permute(0, 2, 1, 3).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_drop(self.o_proj(y))


class FeedForward(Module):
    def __init__(self, n_embd: int, dropout: float, activation: str, backend):
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, backend=backend)
        self.c_proj = Linear(4 * n_embd, n_embd, backend=backend)
        self.drop = Dropout(dropout)
        self.approximate = {"gelu_new": "tanh", "gelu": "none"}[activation]

    def forward(self, x: Tensor) -> Tensor:  # (B, T, C) -> (B, T, 4C) -> (B, T, C)
        return self.drop(self.c_proj(nn.gelu(self.c_fc(x), self.approximate)))


class TransformerLayer(Module):
    """Pre-LN: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, n_embd, n_head, dropout, activation, eps, backend):
        super().__init__()
        self.ln_1 = LayerNorm1d(n_embd, eps, backend)
        self.attn = MultiHeadAttention(n_embd, n_head, dropout, backend)
        self.ln_2 = LayerNorm1d(n_embd, eps, backend)
        self.mlp = FeedForward(n_embd, dropout, activation, backend)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class DecoderLM(Module):
    def __init__(
        self,
        vocab_size,
        block_size,
        n_layer,
        n_head,
        n_embd,
        dropout=0.0,
        activation="gelu_new",
        layer_norm_eps=1e-5,
        backend="reference",
    ):
        super().__init__()
        self.block_size, self.backend = block_size, backend
        self.wte = Embedding(vocab_size, n_embd, backend)
        self.wpe = Embedding(block_size, n_embd, backend)
        self.drop = Dropout(dropout)
        self.h = ModuleList(
            TransformerLayer(n_embd, n_head, dropout, activation, layer_norm_eps, backend) for _ in range(n_layer)
        )
        self.ln_f = LayerNorm1d(n_embd, layer_norm_eps, backend)

    @classmethod
    def from_torch(cls, model, backend="reference") -> DecoderLM:
        """The same network and weights as a torch GPTLMHeadModel (steps/models/gpt.py, GPT-2 variant)."""
        c = model.config
        if (c.pos, c.norm, c.mlp, c.kv_heads, c.bias, c.tie_weights) != (
            "learned",
            "layernorm",
            "gelu",
            c.n_head,
            True,
            True,
        ):
            raise ValueError(
                "DecoderLM mirrors the GPT-2 variant only (learned positions, LayerNorm, GELU MLP, "
                "multi-head attention, biases, tied LM head)"
            )
        ours = cls(
            c.vocab_size,
            c.block_size,
            c.n_layer,
            c.n_head,
            c.n_embd,
            c.dropout,
            c.activation,
            c.layer_norm_eps,
            backend,
        )
        state = {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}
        for name, p in ours.named_parameters():
            value = state[torch_name(name)]
            p.update(tensor(value.T if _is_linear_weight(name) else value, backend=backend))
        return ours

    def forward(self, idx) -> Tensor:
        """(B, T) token ids (a Tensor, an array, lists) -> (B, T, V) logits."""
        idx = as_ids(idx, "DecoderLM.forward: idx")
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.block_size}")
        x = self.drop(self.wte(idx) + self.wpe(np.arange(T)))  # (B, T, C) + (T, C)
        mask = tensor(
            np.triu(np.full((T, T), -1e30), 1), backend=x.backend
        )  # (T, T): a position sees itself and the past
        for block in self.h:
            x = block(x, mask)
        x = self.ln_f(x)  # (B, T, C)
        w = self.wte.weights.value  # (V, C), tied
        return (x.view(B * T, -1) @ w.permute(1, 0)).view(B, T, w.shape[0])  # (B·T, C) @ (C, V)

    def loss(self, idx, targets) -> Tensor:
        """Mean cross-entropy of the (B, T) targets; positions whose target is -100 are ignored."""
        logits = self.forward(idx)
        targets = as_ids(targets, "DecoderLM.loss: targets").reshape(-1)
        keep = targets != -100
        per_token = nn.softmax_loss(logits.view(targets.size, -1), np.where(keep, targets, 0))  # (B·T,)
        return (per_token * tensor(keep.astype(np.float64), backend=logits.backend)).sum() * (1.0 / keep.sum())


def shifted_targets(idx) -> np.ndarray:
    """HF's causal-LM convention on labels = input ids: position t predicts t+1, the last is ignored."""
    idx = as_ids(idx, "shifted_targets: idx")
    return np.concatenate([idx[:, 1:], np.full((idx.shape[0], 1), -100)], axis=1)


def _is_linear_weight(name: str) -> bool:
    return name.endswith("proj.weights") or name.endswith("c_fc.weights")


def torch_name(name: str) -> str:
    """Our parameter name -> steps/models/gpt.py's (Linear weights are stored transposed there)."""
    return "transformer." + name.replace(".weights", ".weight")
