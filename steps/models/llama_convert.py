"""Hugging Face LlamaForCausalLM <-> ours (GPTConfig with the Llama options), both ways.

A rename table, nothing else: both sides store nn.Linear (out, in) weights, q/k/v/o and the MLP
are separate matrices (ours: c_fc = up_proj, c_fc2 = gate_proj, c_proj = down_proj, llm.c's
names), norms are RMSNorm weights only, and both use the rotate-half (NeoX) RoPE layout on the
same q/k rows — HF's Llama checkpoints are already permuted from Meta's interleaved layout by
HF's convert_llama_weights_to_hf.py, so q/k are copied as they are. Carried over: rope_theta,
rms_norm_eps, num_key_value_heads (GQA), intermediate_size, tie_word_embeddings.

fp64 comparison: HF's Llama runs two pieces in float32 whatever the model's dtype (transformers
5.23 modeling_llama.py: LlamaRMSNorm upcasts to float32, LlamaRotaryEmbedding builds its cos/sin
in float32). `float64_reference(hf)` lifts exactly those two to float64 — same formulas, the dtype
is the only change — so an fp64 model is fp64 throughout; fp32 comparisons use HF as shipped.
"""

from __future__ import annotations

import re
import types

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from steps.models import hf_convert
from steps.models.gpt import GPTConfig, GPTLMHeadModel

_TOP = {"transformer.wte": "model.embed_tokens", "transformer.ln_f": "model.norm", "lm_head": "lm_head"}
_BLOCK = {  # our module inside block i -> HF's inside model.layers[i]
    "ln_1": "input_layernorm",
    "attn.q_proj": "self_attn.q_proj",
    "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj",
    "attn.o_proj": "self_attn.o_proj",
    "ln_2": "post_attention_layernorm",
    "mlp.c_fc": "mlp.up_proj",
    "mlp.c_fc2": "mlp.gate_proj",
    "mlp.c_proj": "mlp.down_proj",
}
# HF module names of the points steps.models.parity hooks (ours: transformer.h.{i}.ln_1, ...)
HF_MODULES = {
    "ln_1": "model.layers.{i}.input_layernorm",
    "attn": "model.layers.{i}.self_attn",
    "ln_2": "model.layers.{i}.post_attention_layernorm",
    "mlp": "model.layers.{i}.mlp",
    "block": "model.layers.{i}",
    "ln_f": "model.norm",
}


def _rename(key: str, top: dict, block: dict, ours_prefix: str, hf_prefix: str) -> str:
    module, kind = key.rsplit(".", 1)
    if module in top:
        return f"{top[module]}.{kind}"
    m = re.fullmatch(re.escape(ours_prefix) + r"(\d+)\.(.+)", module)
    if m and m.group(2) in block:
        return f"{hf_prefix}{m.group(1)}.{block[m.group(2)]}.{kind}"
    raise KeyError(f"llama_convert: no counterpart for {key!r}")


def ours_to_hf_state_dict(sd: dict) -> dict:
    return {_rename(k, _TOP, _BLOCK, "transformer.h.", "model.layers."): v for k, v in sd.items()}


def hf_to_ours_state_dict(sd: dict) -> dict:
    top, block = ({v: k for k, v in d.items()} for d in (_TOP, _BLOCK))
    return {_rename(k, top, block, "model.layers.", "transformer.h."): v for k, v in sd.items()}


def config_from_hf(hf: LlamaConfig) -> GPTConfig:
    rope = hf.rope_parameters or {}
    unsupported = {
        "hidden_act": (hf.hidden_act, "silu"),
        "attention_bias": (hf.attention_bias, False),
        "mlp_bias": (hf.mlp_bias, False),
        "rope_type": (rope.get("rope_type", "default"), "default"),
        "head_dim": (hf.head_dim, hf.hidden_size // hf.num_attention_heads),
        "attention_dropout": (hf.attention_dropout, 0.0),
        "pretraining_tp": (getattr(hf, "pretraining_tp", 1), 1),
    }
    bad = {k: got for k, (got, want) in unsupported.items() if got != want}
    if bad:
        raise ValueError(f"LlamaConfig {bad} unsupported: ours needs { ({k: w for k, (_, w) in unsupported.items()}) }")
    return rope_gpt_config(hf, rope)


def rope_gpt_config(hf, rope: dict, **extra) -> GPTConfig:
    """Our Llama-family GPTConfig (RoPE, RMSNorm, SwiGLU, no biases) from an HF Llama-style config
    (LlamaConfig, MixtralConfig, ...); `extra` adds what the family has beyond Llama (e.g. moe)."""
    return GPTConfig(
        vocab_size=hf.vocab_size,
        block_size=hf.max_position_embeddings,
        n_layer=hf.num_hidden_layers,
        n_head=hf.num_attention_heads,
        n_kv_head=hf.num_key_value_heads,
        n_embd=hf.hidden_size,
        dropout=0.0,
        bias=False,
        pos="rope",
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        norm="rmsnorm",
        layer_norm_eps=hf.rms_norm_eps,
        mlp="swiglu",
        mlp_hidden=hf.intermediate_size,
        tie_weights=hf.tie_word_embeddings,
        **extra,
    )


def hf_config_from_ours(c: GPTConfig) -> LlamaConfig:
    if (c.pos, c.norm, c.mlp, c.bias, c.dropout) != ("rope", "rmsnorm", "swiglu", False, 0.0):
        raise ValueError("a Llama equivalent needs pos=rope, norm=rmsnorm, mlp=swiglu, bias=False, dropout=0")
    return LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        intermediate_size=c.mlp_width,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        num_key_value_heads=c.kv_heads,
        max_position_embeddings=c.block_size,
        rms_norm_eps=c.layer_norm_eps,
        rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_weights,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def from_hf(hf_model) -> GPTLMHeadModel:
    """Ours with the weights, dtype and device of an HF LlamaForCausalLM."""
    return hf_convert.ours_like(hf_model, config_from_hf(hf_model.config), hf_to_ours_state_dict(hf_model.state_dict()))


def to_hf(model: GPTLMHeadModel) -> LlamaForCausalLM:
    hf = hf_convert.hf_like(model, LlamaForCausalLM, hf_config_from_ours(model.config))
    hf.load_state_dict(ours_to_hf_state_dict(model.state_dict()), strict=True)
    return hf.eval()


def _rms_norm_forward(self, hidden_states):  # LlamaRMSNorm.forward without the float32 round trip
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@torch.no_grad()
def _rotary_forward(self, x, position_ids):  # LlamaRotaryEmbedding.forward in float64 instead of float32
    freqs = position_ids[..., None].double() * self.inv_freq64.to(x.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def float64_reference(hf: LlamaForCausalLM) -> LlamaForCausalLM:
    """In place: HF's float32 RMSNorm and RoPE tables lifted to float64 (see the module docstring)."""
    c = hf.config
    for m in hf.modules():
        name = type(m).__name__
        if name.endswith("RMSNorm"):  # LlamaRMSNorm, MixtralRMSNorm
            m.forward = types.MethodType(_rms_norm_forward, m)
        elif name.endswith("RotaryEmbedding"):
            dim = c.head_dim or c.hidden_size // c.num_attention_heads
            theta = c.rope_parameters["rope_theta"]
            m.inv_freq64 = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # HF's formula
            m.forward = types.MethodType(_rotary_forward, m)
    return hf
