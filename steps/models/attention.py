"""Causal multi-head self-attention with separate q/k/v/o projections.

Separate projections (instead of GPT-2's fused c_attn) make tensor parallelism a one-liner:
ColwiseParallel on q/k/v splits the heads across ranks, RowwiseParallel on o_proj sums them back.
That is why the number of heads is read from the tensor (`view(B, T, -1, head_dim)`), never from
the config: a TP rank holds only its local heads.

Grouped-query attention (Ainslie et al. 2023; Llama 2/3): n_kv_head < n_head key/value heads, query
head j reads key/value head j // (n_head / n_kv_head); n_kv_head = 1 is multi-query attention
(Shazeer 2019). k_proj/v_proj are n_kv_head·hs wide and the KV cache holds only those heads (the
point: n_head/n_kv_head times less cache). Under TP each rank keeps n_head/tp query and
n_kv_head/tp key/value heads, which preserves the grouping: n_kv_head must divide by tp.

Two paths compute the same thing:
- "sdpa": F.scaled_dot_product_attention (fused, the fast default);
- "manual": softmax(q k^T / sqrt(d) + mask) v with the hand-written Softmax Function.

Speed: when q/k/v are plain nn.Linear on ordinary tensors (no TP/FSDP DTensors, no hooks, not
swapped for the hand-written Linear) they run as ONE matmul on the concatenated weights — one
large GEMM is faster than three small ones on a CPU; the weight copy is tiny (3·d² vs B·T·3d).
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

from steps.models.positional import rope_cos_sin, rope_neox
from steps.models.softmax import softmax


def _is_dtensor(t: torch.Tensor) -> bool:
    """A DTensor exists only once torch.distributed.tensor is imported (TP/FSDP import it): looked up,
    not imported here, because importing it costs every job that builds a GPT ~1 s (sympy, DTensor ops)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def _plain_linear(m: nn.Module) -> bool:
    return type(m) is nn.Linear and not _is_dtensor(m.weight) and not (m._forward_hooks or m._forward_pre_hooks)


def causal_mask(t_q: int, t_k: int, device=None) -> torch.Tensor:
    """Bool (t_q, t_k), True = may attend; bottom-right aligned for the KV-cache case."""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(t_k - t_q)  # (t_q, t_k)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        d = config.n_embd
        self.head_dim = d // config.n_head
        kv = config.kv_heads * self.head_dim  # = d unless grouped-query
        self.q_proj = nn.Linear(d, d, bias=config.bias)
        self.k_proj = nn.Linear(d, kv, bias=config.bias)
        self.v_proj = nn.Linear(d, kv, bias=config.bias)
        self.o_proj = nn.Linear(d, d, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.impl = config.attn
        self.rope = config.pos == "rope"
        self.rope_theta = config.rope_theta
        self.softmax = softmax  # manual path's softmax; the perf stage plugs in a fused kernel

    def qkv(self, x):
        projs = (self.q_proj, self.k_proj, self.v_proj)
        if not all(map(_plain_linear, projs)):
            return [p(x) for p in projs]  # (B, T, C), 2 × (B, T, nkv·hs); nkv·hs = C unless GQA
        w = torch.cat([p.weight for p in projs])  # (C + 2·nkv·hs, C)
        b = None if self.q_proj.bias is None else torch.cat([p.bias for p in projs])  # (C + 2·nkv·hs,)
        return F.linear(x, w, b).split([p.weight.shape[0] for p in projs], dim=-1)  # -> (B, T, C), 2 × (B, T, nkv·hs)

    def _group(self, q_width: int, kv_width: int) -> int:
        """Query heads per key/value head, from the (local) projection widths; a clear error where a
        tensor-parallel split broke the grouping (e.g. MQA's single kv head over tp > 1 ranks)."""
        hs = self.head_dim
        if kv_width % hs or (q_width // hs) % (kv_width // hs):
            raise ValueError(
                f"attention: {q_width // hs} query heads cannot share key/value projections of width {kv_width} "
                f"(head size {hs}); under tensor parallelism n_kv_head must be divisible by the tp degree"
            )
        return q_width // kv_width

    def forward(self, x, layer_past=None, use_cache=False):
        B, T, _ = x.shape  # x: (B, T, C)
        qkv = self.qkv(x)  # (B, T, nh·hs), 2 × (B, T, nkv·hs)
        g = self._group(qkv[0].shape[-1], qkv[1].shape[-1])  # query heads per key/value head
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in qkv)  # (B, nh, T, hs), 2 × (B, nkv, T, hs)
        past = 0 if layer_past is None else layer_past[0].shape[2]  # T_past cached; T_k = T_past + T
        if self.rope:  # rotate q and k by their absolute positions past .. past+T-1 (NeoX layout)
            cos, sin = rope_cos_sin(past + T, self.head_dim, self.rope_theta, dtype=q.dtype, device=q.device)
            q, k = rope_neox(q, cos[past:], sin[past:]), rope_neox(k, cos[past:], sin[past:])  # cos: (T_k, hs/2)
        if layer_past is not None:
            k, v = torch.cat((layer_past[0], k), dim=2), torch.cat((layer_past[1], v), dim=2)  # (B, nkv, T_k, hs)
        p = self.dropout if self.training else 0.0
        if self.impl == "sdpa":
            gqa = {"enable_gqa": True} if g > 1 else {}  # SDPA broadcasts each kv head over its g query heads
            if past == 0:  # plain causal (top-left == bottom-right when T_q == T_k)
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, **gqa)  # (B, nh, T, hs)
            else:  # cached decoding: new queries see every cached key
                mask = None if T == 1 else causal_mask(T, k.shape[2], x.device)  # (T, T_k)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, **gqa)  # (B, nh, T, hs)
        elif self.impl == "manual":
            kr, vr = (k, v) if g == 1 else (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))  # (B, nh, T_k, hs)
            att = (q @ kr.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, T, T_k)
            att = self.softmax(att, causal_mask(T, k.shape[2], x.device))  # (B, nh, T, T_k)
            y = F.dropout(att, p, self.training) @ vr  # (B, nh, T, T_k) @ (B, nh, T_k, hs) -> (B, nh, T, hs)
        else:
            raise ValueError(f"attn must be 'sdpa' or 'manual', got {self.impl!r}")
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C): the (local) heads side by side
        y = self.resid_dropout(self.o_proj(y))  # (B, T, C)
        return (y, (k, v)) if use_cache else y
