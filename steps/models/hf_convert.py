"""Hugging Face GPT-2 <-> ours, both ways.

Two differences only:
1. HF's Conv1D stores weights as (in, out) and computes x @ W + b; nn.Linear stores (out, in):
   every projection weight is transposed.
2. HF fuses q, k, v into one c_attn of width 3d; we keep q_proj/k_proj/v_proj separate
   (split along the output dimension, in that order).
The same functions convert gradients (a dict of .grad tensors has the same shapes as the weights).
"""

from __future__ import annotations

import dataclasses
import re

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from steps.models.gpt import GPTConfig, GPTLMHeadModel

_TRANSPOSED = ("attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_RENAMED = {"attn.c_proj": "attn.o_proj"}


def config_from_hf(hf) -> GPTConfig:
    if hf.n_inner not in (None, 4 * hf.n_embd):
        raise ValueError(f"n_inner={hf.n_inner} unsupported: our MLP is 4 * n_embd")
    if hf.activation_function not in ("gelu_new", "gelu"):
        raise ValueError(f"activation_function {hf.activation_function!r} unsupported")
    if hf.scale_attn_by_inverse_layer_idx or not hf.scale_attn_weights:
        raise ValueError("only GPT-2's 1/sqrt(head_dim) attention scaling is supported")
    return GPTConfig(
        vocab_size=hf.vocab_size,
        block_size=hf.n_positions,
        n_layer=hf.n_layer,
        n_head=hf.n_head,
        n_embd=hf.n_embd,
        dropout=hf.resid_pdrop,
        bias=True,
        activation=hf.activation_function,
        layer_norm_eps=hf.layer_norm_epsilon,
        tie_weights=hf.tie_word_embeddings,
    )


# GPTConfig fields GPT2Config can express (or that change training only, not the function the
# weights compute); any other field must keep its default, or the model has no GPT-2 equivalent.
_GPT2_FIELDS = {
    "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "pos", "norm",
    "attn", "activation", "layer_norm_eps", "tie_weights", "checkpoint_activations", "fused_ce", "ce_chunk",
    "mlp", "mlp_hidden", "n_kv_head",  # checked above: GPT-2's MLP width and one kv head per head
    "rope_theta",  # read only with pos=rope
}  # fmt: skip


def hf_config_from_ours(c: GPTConfig):
    """GPT2Config of our config; ValueError naming the first option GPT-2 cannot express."""
    if c.pos != "learned" or c.norm != "layernorm" or not c.bias:
        raise ValueError("only pos=learned, norm=layernorm, bias=True has a GPT-2 equivalent")
    if c.activation not in ("gelu_new", "gelu"):
        raise ValueError(f"activation={c.activation!r} has no GPT-2 equivalent (gelu_new | gelu)")
    if c.mlp != "gelu" or c.mlp_width != 4 * c.n_embd:
        raise ValueError(f"mlp={c.mlp!r} of width {c.mlp_width} has no GPT-2 equivalent (gelu, 4 * n_embd)")
    if c.kv_heads != c.n_head:
        raise ValueError(f"n_kv_head={c.n_kv_head} has no GPT-2 equivalent")
    for f in dataclasses.fields(c):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if f.name not in _GPT2_FIELDS and getattr(c, f.name) != default:
            raise ValueError(f"{f.name}={getattr(c, f.name)!r} has no GPT-2 equivalent")
    return GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.block_size,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_embd=c.n_embd,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        activation_function=c.activation,
        layer_norm_epsilon=c.layer_norm_eps,
        tie_word_embeddings=c.tie_weights,
        bos_token_id=None,
        eos_token_id=None,
    )


def hf_to_ours_state_dict(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        if k.endswith(("attn.bias", "attn.masked_bias")) and v.dim() > 1:
            continue  # old checkpoints carry the causal mask as a buffer
        m = re.match(r"(.*\.attn)\.c_attn\.(weight|bias)$", k)
        if m:
            prefix, kind = m.groups()
            parts = v.chunk(3, dim=-1)  # Conv1D weight (d, 3d) / bias (3d,): split the out dim
            for name, p in zip(("q_proj", "k_proj", "v_proj"), parts):
                out[f"{prefix}.{name}.{kind}"] = p.t().contiguous() if kind == "weight" else p.clone()
            continue
        if k.endswith(_TRANSPOSED):
            v = v.t().contiguous()
        for a, b in _RENAMED.items():
            k = k.replace(a, b)
        out[k] = v
    return out


def ours_to_hf_state_dict(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        m = re.match(r"(.*\.attn)\.(q_proj|k_proj|v_proj)\.(weight|bias)$", k)
        if m:
            prefix, name, kind = m.groups()
            if name != "q_proj":
                continue
            parts = [sd[f"{prefix}.{n}.{kind}"] for n in ("q_proj", "k_proj", "v_proj")]
            fused = torch.cat([p.t() if kind == "weight" else p for p in parts], dim=-1)
            out[f"{prefix}.c_attn.{kind}"] = fused.contiguous()
            continue
        for a, b in _RENAMED.items():
            k = k.replace(b, a)
        out[k] = v.t().contiguous() if k.endswith(_TRANSPOSED) else v
    return out


def ours_like(hf_model, config: GPTConfig, state_dict: dict) -> GPTLMHeadModel:
    """Our GPTLMHeadModel of `config` holding `state_dict`, built with the dtype and on the device of
    `hf_model` (an HF model on CUDA gives ours on the same GPU, where the caller's ids are)."""
    ref = next(hf_model.parameters())
    with torch.device(ref.device):
        model = GPTLMHeadModel(config).to(ref.dtype)
    model.load_state_dict(state_dict, strict=True)
    return model


def hf_like(model: GPTLMHeadModel, hf_class, hf_config):
    """An HF model of `hf_class`/`hf_config` built with our model's dtype and on its device (the
    caller loads the weights)."""
    ref = next(model.parameters())
    with torch.device(ref.device):
        return hf_class(hf_config).to(ref.dtype)


def from_hf(hf_model) -> GPTLMHeadModel:
    """Our GPTLMHeadModel with the weights, dtype and device of an HF GPT2LMHeadModel."""
    return ours_like(hf_model, config_from_hf(hf_model.config), hf_to_ours_state_dict(hf_model.state_dict()))


def to_hf(model: GPTLMHeadModel):
    hf = hf_like(model, GPT2LMHeadModel, hf_config_from_ours(model.config))
    missing, unexpected = hf.load_state_dict(ours_to_hf_state_dict(model.state_dict()), strict=False)
    bad = [k for k in missing if not k.endswith(("attn.bias", "attn.masked_bias"))] + unexpected
    if bad:
        raise RuntimeError(f"to_hf: state dict mismatch {bad[:5]}")
    return hf.eval()
