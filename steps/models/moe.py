"""Mixture of experts: each block's MLP becomes E expert MLPs and a router that sends every token to
top_k of them (Shazeer et al. 2017 "Outrageously Large Neural Networks"; Fedus et al. 2021 "Switch
Transformers"; Jiang et al. 2024 "Mixtral of Experts").

    GPTConfig(moe={"experts": 8, "top_k": 2, "aux_loss_coef": 0.001, "capacity_factor": None}, ...)

Router (Mixtral, HF MixtralTopKRouter): logits = x W_g^T (N, E); p = softmax(logits); the top_k
probabilities are renormalised to sum to 1 and weight the chosen experts' outputs:
    y_n = sum_{e in topk(p_n)} (p_ne / sum_{e' in topk} p_ne') * expert_e(x_n)
norm_topk_prob=False keeps the raw p_ne (OLMoE, Qwen-MoE's option of the same name).

Experts are GPT-2 or SwiGLU MLPs (config.mlp) of width config.mlp_width, stored as stacked (E, ...)
tensors (torchtitan's GroupedExperts layout; HF Mixtral's too, up to the fused gate_up_proj): so
expert parallelism shards them by slicing dim 0. Names follow mlp.py: c_fc (up), c_fc2 (gate), c_proj.

Load-balancing loss as HF Mixtral computes it (modeling_mixtral.load_balancing_loss_func, Switch
eqs. 4-6): over all L MoE layers together, f_e = (top-k selections of expert e) / (L·N) and
P_e = (sum of router probabilities of e) / (L·N), aux = E · sum_e f_e P_e (= top_k when uniform).
Note the layers are pooled before the product, not summed layer by layer. The model's training loss
is CE + aux_loss_coef · aux (GPTLMHeadModel).

Capacity factor (Switch/GShard; HF Mixtral has none): each expert takes at most
ceil(capacity_factor · N · top_k / E) assignments, first come first served in token order
(token-major over the (N, top_k) choices); the rest are dropped, the token keeping only its other
experts' weighted outputs (no renormalisation) and the residual. `MoE.dropped` counts them.

Shapes: N = B·T tokens, E experts, k = top_k, M = kept assignments (N·k without a capacity).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from steps.models.mlp import ACTIVATIONS

MOE_DEFAULTS = {"experts": 8, "top_k": 2, "aux_loss_coef": 0.001, "capacity_factor": None, "norm_topk_prob": True}


def moe_settings(moe: dict) -> dict:
    """GPTConfig.moe with defaults filled in, checked (ValueError names the field and the fix)."""
    unknown = set(moe) - set(MOE_DEFAULTS)
    if unknown:
        raise ValueError(f"GPTConfig.moe: unknown keys {sorted(unknown)}; known: {list(MOE_DEFAULTS)}")
    m = {**MOE_DEFAULTS, **moe}
    if not (isinstance(m["experts"], int) and isinstance(m["top_k"], int) and 1 <= m["top_k"] <= m["experts"]):
        raise ValueError(f"GPTConfig.moe needs integers 1 <= top_k <= experts, got {m}")
    if m["capacity_factor"] is not None and not m["capacity_factor"] > 0:
        raise ValueError(f"GPTConfig.moe.capacity_factor must be > 0 or null (no dropping), got {m}")
    return m


class Experts(nn.Module):
    """E MLPs as stacked weights; forward takes rows already grouped by expert."""

    def __init__(self, n_experts: int, n_embd: int, hidden: int, swiglu: bool, activation: str):
        super().__init__()
        E, C, H = n_experts, n_embd, hidden
        self.c_fc = nn.Parameter(torch.empty(E, H, C))  # up, like nn.Linear (out, in) per expert
        self.c_fc2 = nn.Parameter(torch.empty(E, H, C)) if swiglu else None  # gate
        self.c_proj = nn.Parameter(torch.empty(E, C, H))  # down
        self.activation = "silu" if swiglu else activation
        self.act = F.silu if swiglu else ACTIVATIONS[activation]
        for p in self.parameters():
            nn.init.normal_(p, 0.0, 0.02)

    @torch.no_grad()
    def select(self, experts: slice) -> "Experts":
        """A copy holding only experts[experts] (expert parallelism's local shard)."""
        E, H, C = self.c_fc.shape
        out = Experts(len(range(E)[experts]), C, H, self.c_fc2 is not None, self.activation)
        out = out.to(self.c_fc.dtype).to(self.c_fc.device)
        for name, p in out.named_parameters():
            p.copy_(getattr(self, name)[experts])
        return out

    @property
    def n_experts(self) -> int:
        return self.c_fc.shape[0]

    def forward(self, x, counts: list[int]):
        """x: (M, C), rows of expert 0 first, then expert 1, ...; counts[e] rows each -> (M, C)."""
        return grouped_mlp(x, counts, self.c_fc, self.c_fc2, self.c_proj, self.act)


def grouped_mlp(x, counts: list[int], c_fc, c_fc2, c_proj, act):
    """Expert e's MLP on its counts[e] rows of x (M, C), for the experts whose (E, ...) weights are given."""
    out = []
    for e, rows in enumerate(x.split(counts)):  # rows: (counts[e], C)
        h = rows @ c_fc[e].T  # (m, H)
        h = act(rows @ c_fc2[e].T) * h if c_fc2 is not None else act(h)
        out.append(h @ c_proj[e].T)  # (m, C)
    return torch.cat(out) if out else x.new_zeros(0, x.shape[1])


def route(probs, top_k: int, renormalise: bool = True):
    """Top-k experts per token and their (renormalised) weights: (N, E) -> (N, k), (N, k)."""
    top_p, top_i = probs.topk(top_k, dim=-1)  # (N, k) each, largest first
    return (top_p / top_p.sum(-1, keepdim=True) if renormalise else top_p), top_i


def selections(top_i, n_experts: int):
    """(N, k) chosen experts -> (E,) int64 times each was chosen (a bincount of fixed length: no
    data-dependent shape, so it also runs on fake tensors)."""
    flat = top_i.reshape(-1)
    return flat.new_zeros(n_experts).scatter_add_(0, flat, torch.ones_like(flat))


def capacity_keep(top_i, n_experts: int, capacity: int):
    """(N, k) bool: an assignment is kept if fewer than `capacity` earlier ones (token-major) chose its expert."""
    onehot = F.one_hot(top_i.reshape(-1), n_experts)  # (N·k, E)
    position = (onehot.cumsum(0) * onehot).sum(-1) - 1  # (N·k,) 0-based place in its expert's queue
    return (position < capacity).view_as(top_i)


class MoE(nn.Module):
    """Router + experts; a drop-in for the block's MLP: (B, T, C) -> (B, T, C).

    After each forward: `stats` = (selections per expert (E,), summed router probabilities (E,), N)
    for the load-balancing loss, and `dropped` = assignments over capacity (0 without one).
    Expert parallelism (steps/sharding/{scratch,native}/ep.py) overrides two methods: run_experts
    (the grouped rows go to their experts' ranks and come back) and pool_stats (the load-balancing
    statistics summed over the ranks, so every rank's aux loss is the global batch's)."""

    def __init__(self, config):
        super().__init__()
        m = moe_settings(config.moe)
        self.top_k, self.capacity_factor, self.renormalise = m["top_k"], m["capacity_factor"], m["norm_topk_prob"]
        self.n_experts = m["experts"]
        self.gate = nn.Linear(config.n_embd, self.n_experts, bias=False)  # router W_g (E, C)
        self.experts = Experts(
            self.n_experts, config.n_embd, config.mlp_width, config.mlp == "swiglu", config.activation
        )
        self.dropout = nn.Dropout(config.dropout)
        self.stats, self.dropped = None, 0

    def forward(self, x):
        B, T, C = x.shape
        E, k = self.n_experts, self.top_k
        x = x.reshape(-1, C)  # (N, C)
        logits = self.gate(x)  # (N, E)
        probs = F.softmax(logits if logits.dtype in (torch.float32, torch.float64) else logits.float(), dim=-1)
        weights, top_i = route(probs, k, self.renormalise)  # (N, k), (N, k)
        self.stats = self.pool_stats(selections(top_i, E).to(probs.dtype), probs.sum(0), len(x))
        choice = top_i.reshape(-1)  # (N·k,) expert of each assignment, token-major
        if self.capacity_factor is not None:
            keep = capacity_keep(top_i, E, math.ceil(self.capacity_factor * x.shape[0] * k / E)).reshape(-1)
            self.dropped = int((~keep).sum())
            choice = torch.where(keep, choice, E)  # dropped assignments -> a bin past the last expert
        order = torch.argsort(choice, stable=True)  # (N·k,) assignments grouped by expert
        counts = self.expert_counts(choice)  # rows per expert (dropped excluded)
        order = order[: sum(counts)]  # (M,)
        token = order // k  # (M,) the token of each kept assignment
        y = self.run_experts(x[token], counts)  # (M, C)
        y = y * weights.reshape(-1)[order, None].to(y.dtype)  # (M, C) gate-weighted
        out = torch.zeros_like(x).index_add(0, token, y)  # (N, C) sum over each token's experts
        return self.dropout(out.view(B, T, C))

    def expert_counts(self, choice) -> list[int]:
        """Rows per expert of the (N·k,) assignments (E: dropped). The scale stage's fake-tensor step
        overrides it with balanced routing (steps/scale/balanced_moe.py): fake tensors have no values to count."""
        return torch.bincount(choice, minlength=self.n_experts + 1)[: self.n_experts].tolist()

    def run_experts(self, rows, counts: list[int]):
        """(M, C) rows grouped by expert, counts[e] each -> (M, C) expert outputs, same order."""
        return self.experts(rows, counts)

    def pool_stats(self, counts, prob_sum, n_tokens: int) -> tuple:
        """(selections (E,), router probability sums (E,), tokens) of this forward's batch."""
        return counts, prob_sum, n_tokens


def load_balancing_loss(stats: list) -> torch.Tensor:
    """HF Mixtral's auxiliary loss from every MoE layer's (selections (E,), prob sums (E,), N); see top."""
    counts = sum(s[0] for s in stats)  # (E,)
    prob_sum = sum(s[1] for s in stats)  # (E,)
    rows = sum(s[2] for s in stats)  # L·N
    return counts.numel() * ((counts / rows) * (prob_sum / rows)).sum()
