"""The GPT: embeddings -> n_layer pre-LN blocks -> final norm -> LM head (tied or not).

Variants (GPTConfig): GPT-2 by default; Llama is pos="rope" (rope_theta), norm="rmsnorm",
mlp="swiglu" (mlp_hidden), n_kv_head < n_head (grouped-query attention; 1 = multi-query,
Shazeer 2019 "Fast Transformer Decoding"), bias=False, tie_weights=False. Named full-size
shapes (GPT-2 124M..1.5B, Llama-3 8B/70B, Mixtral-8x7B, OLMoE-1B-7B): steps/models/shapes.py; HF
Llama <-> ours: llama_convert.py. GPTConfig.moe makes every MLP a mixture of experts (moe.py; HF
Mixtral <-> ours: mixtral_convert.py); its load-balancing loss joins the loss (CausalLMOutput.aux_loss).

Module names follow Hugging Face GPT-2 (transformer.wte/wpe/h[i].ln_1/attn/ln_2/mlp/ln_f, lm_head)
so hf_convert.py reads as a rename table. Attention uses separate q/k/v/o projections (see
attention.py) — the only structural difference from GPT-2's fused Conv1D c_attn.

Loss convention (identical to HF GPT2LMHeadModel): pass `labels=input_ids`; the model shifts
internally, position t is scored against labels[t+1], the last position is dropped, and
labels == -100 are ignored. Mean over the scored tokens.

GPTConfig.fused_ce (default off): in training mode with labels, the loss comes from
steps.models.chunked_ce.linear_cross_entropy (LM head + cross-entropy chunk by chunk, never the
(B·T, V) logits) and the output's `logits` is None. Eval mode, generation and calls without
labels are unchanged. ce_chunk: rows per chunk, 0 = chunked_ce.default_chunk_size.

Shape comments use nanoGPT's letters: B batch, T sequence length, C = n_embd, V vocabulary, nh
heads (in attention.py a tensor-parallel rank's local heads), hs = head size; with a KV cache,
T_past cached positions and T_k = T_past + T keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from steps.models.attention import CausalSelfAttention
from steps.models.chunked_ce import linear_cross_entropy
from steps.models.linear import Linear
from steps.models.mlp import make_mlp, swiglu_hidden
from steps.models.moe import MoE, load_balancing_loss, moe_settings
from steps.models.norms import LayerNorm, RMSNorm, make_norm


@dataclass
class GPTConfig:
    """The model's knobs and their defaults: the only declaration (the stage schemas' entries for
    these keys must match it: tests/test_config_knobs.py)."""

    vocab_size: int = 8192
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    dropout: float = 0.0
    bias: bool = True
    pos: Literal["learned", "rope"] = "learned"  # learned: GPT-2 wpe; rope: rotary, NeoX layout, no wpe
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    attn: Literal["sdpa", "manual"] = "sdpa"  # sdpa: fused; manual: hand-written softmax
    activation: Literal["gelu_new", "gelu"] = "gelu_new"  # gelu_new: tanh, GPT-2; gelu: exact
    layer_norm_eps: float = 1e-5
    tie_weights: bool = True
    checkpoint_activations: bool = False
    fused_ce: bool = False  # training loss via chunked_ce (no logits returned); see top
    ce_chunk: int = 0  # rows per chunk of the fused loss; 0 = default_chunk_size
    mlp: Literal["gelu", "swiglu"] = "gelu"  # GPT-2: c_proj(act(c_fc x)); Llama: c_proj(silu(c_fc2 x) * c_fc x)
    mlp_hidden: int | None = None  # MLP width; None = 4·C (gelu) or Llama's 8/3·C rounded up to 256 (swiglu)
    n_kv_head: int | None = None  # key/value heads; None = n_head (MHA), 1 = MQA, in between = GQA
    rope_theta: float = 10000.0  # RoPE base (Llama 3: 500000)
    moe: dict | None = None  # mixture of experts {experts, top_k, aux_loss_coef, capacity_factor}: see moe.py

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {self.mlp!r}")
        if self.n_kv_head is not None and not (0 < self.n_kv_head <= self.n_head and self.n_head % self.n_kv_head == 0):
            raise ValueError(f"n_kv_head={self.n_kv_head} must divide n_head={self.n_head} (None = n_head, 1 = MQA)")
        if self.pos not in ("learned", "rope"):
            raise ValueError(f"pos must be 'learned' or 'rope', got {self.pos!r}")
        if self.pos == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("rope needs an even head_dim")
        if self.moe is not None:
            self.moe = moe_settings(self.moe)

    def knobs(self, **changes) -> "GPTConfig":
        """The GPTConfig part of a stage's model section (a dataclass extending GPTConfig with the
        stage's own keys: perf.model, minitorch.gpt), with `changes`."""
        return GPTConfig(**{**{f.name: getattr(self, f.name) for f in fields(GPTConfig)}, **changes})

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def mlp_width(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        return 4 * self.n_embd if self.mlp == "gelu" else swiglu_hidden(self.n_embd)


@dataclass
class GPTModelOutput:
    last_hidden_state: torch.Tensor
    past_key_values: tuple | None = None


@dataclass
class CausalLMOutput:
    logits: torch.Tensor | None  # None from a fused_ce training forward with labels
    loss: torch.Tensor | None = None
    past_key_values: tuple | None = None  # per layer (k, v), each (B, n_kv_head, T_total, head_dim)
    aux_loss: torch.Tensor | None = None  # MoE load-balancing loss (already in `loss`, times aux_loss_coef)


class Block(nn.Module):
    """Pre-LN: x + attn(ln_1(x)), then + mlp(ln_2(x)). Returns x, or (x, (k, v)) with use_cache."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = make_norm(config.norm, config.n_embd, config.layer_norm_eps, config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config.norm, config.n_embd, config.layer_norm_eps, config.bias)
        self.mlp = MoE(config) if config.moe else make_mlp(config)

    def forward(self, x, layer_past=None, use_cache=False):
        a = self.attn(self.ln_1(x), layer_past, use_cache)  # (B, T, C), or ((B, T, C), (k, v)) with use_cache
        if use_cache:
            a, present = a
        x = x + a  # (B, T, C)
        x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return (x, present) if use_cache else x


class GPTModel(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.pos == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = make_norm(config.norm, config.n_embd, config.layer_norm_eps, config.bias)

    def forward(self, input_ids, past_key_values=None, use_cache=False) -> GPTModelOutput:
        B, T = input_ids.shape  # input_ids: (B, T) token ids
        past = 0 if past_key_values is None else past_key_values[0][0].shape[2]  # T_past cached positions
        if past + T > self.config.block_size and self.wpe is not None:
            raise ValueError(f"sequence length {past + T} > block_size {self.config.block_size}")
        x = self.wte(input_ids)  # token embeddings (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(past, past + T, device=input_ids.device))  # + position embeddings (T, C)
        x = self.drop(x)  # (B, T, C)
        presents = []
        for i, block in enumerate(self.h):
            if use_cache:
                x, kv = block(x, None if past_key_values is None else past_key_values[i], True)  # (B, T, C), (k, v)
                presents.append(kv)
            elif self.config.checkpoint_activations and self.training:
                x = checkpoint(block, x, use_reentrant=False)  # (B, T, C); recompute in backward, save memory
            else:
                x = block(x)  # (B, T, C)
        return GPTModelOutput(self.ln_f(x), tuple(presents) if use_cache else None)  # last_hidden_state (B, T, C)


class GPTLMHeadModel(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = GPTModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        # GPT-2 scheme: residual projections scaled by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "mlp.c_proj.weight", "mlp.experts.c_proj")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (tied weights once); non_embedding drops wpe (nanoGPT's convention:
        wte stays in because it is also the LM head's matmul)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.transformer.wpe is not None:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, input_ids, labels=None, past_key_values=None, use_cache=False) -> CausalLMOutput:
        out = self.transformer(input_ids, past_key_values, use_cache)
        aux = self.moe_aux_loss()
        if self.config.fused_ce and labels is not None and self.training and not use_cache:
            loss = linear_cross_entropy(
                out.last_hidden_state,
                self.lm_head.weight,  # (B, T, C), (V, C)
                shift_labels(labels),
                chunk_size=self.config.ce_chunk,
            )  # -> scalar
            return CausalLMOutput(None, self._with_aux(loss, aux), out.past_key_values, aux)
        logits = self.lm_head(out.last_hidden_state)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = self._with_aux(causal_lm_loss(logits, labels), aux)  # scalar
        return CausalLMOutput(logits, loss, out.past_key_values, aux)

    def moe_aux_loss(self):
        """The load-balancing loss of the last forward (moe.load_balancing_loss), None without MoE."""
        stats = [m.stats for m in self.modules() if isinstance(m, MoE)]
        return load_balancing_loss(stats) if stats else None

    def _with_aux(self, loss, aux):
        return loss if aux is None else loss + self.config.moe["aux_loss_coef"] * aux.to(loss.dtype)


def shift_labels(labels, ignore_index: int = -100):
    """(B, T) targets of positions 0..T-1: labels[:, t+1], the last position padded as ignored."""
    return F.pad(labels[:, 1:], (0, 1), value=ignore_index)  # (B, T)


def causal_lm_loss(logits, labels, ignore_index: int = -100):
    """HF's shift: logits[:, t] predict labels[:, t+1]. Shifting the labels (pad with -100)
    rather than slicing logits[:, :-1] avoids copying the (B, T, V) logits. The softmax runs in fp32
    for fp16/bf16/fp32 logits and in fp64 for fp64 ones (HF's loss casts fp64 logits down to fp32:
    parity.float64_loss lifts a reference model's loss)."""
    shifted = shift_labels(labels, ignore_index)  # (B, T)
    if logits.dtype != torch.float64:
        logits = logits.float()  # half-precision logits: softmax in fp32; fp64 stays fp64
    return F.cross_entropy(
        logits.view(-1, logits.shape[-1]),
        shifted.reshape(-1),  # (B·T, V) vs (B·T,)
        ignore_index=ignore_index,
    )  # -> scalar


def use_custom_functions(model: nn.Module, attention: bool = True) -> nn.Module:
    """Swap the hand-written autograd Functions in, in place: same parameters, same state dict.
    Used by the components/parity stages; training keeps the fused torch ops."""
    swap = {nn.Linear: Linear, nn.LayerNorm: LayerNorm, nn.RMSNorm: RMSNorm}
    for m in model.modules():
        if type(m) in swap:
            m.__class__ = swap[type(m)]
        if attention and isinstance(m, CausalSelfAttention):
            m.impl = "manual"
    return model
