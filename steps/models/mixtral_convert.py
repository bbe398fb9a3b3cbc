"""Hugging Face MixtralForCausalLM <-> ours (Llama options + GPTConfig.moe), both ways.

Mixtral is Llama (GQA, RoPE, RMSNorm, untied head; llama_convert's rename table) with each MLP a
sparse MoE block (HF MixtralSparseMoeBlock, transformers 5.23):
    model.layers.i.mlp.gate.weight           (E, C)       -> transformer.h.i.mlp.gate.weight (router)
    model.layers.i.mlp.experts.gate_up_proj  (E, 2H, C)   -> mlp.experts.c_fc2 (gate, first H rows), c_fc (up)
    model.layers.i.mlp.experts.down_proj     (E, C, H)    -> mlp.experts.c_proj
The only non-rename: HF fuses gate and up (`gate, up = linear(x, gate_up_proj[e]).chunk(2)`).
Carried over: num_local_experts, num_experts_per_tok, router_aux_loss_coef. Rejected: sliding-window
attention, router jitter (ours has neither).

fp64 comparison: HF runs in float32 whatever the model's dtype: RMSNorm and the RoPE tables (as
Llama), the router softmax (`softmax(router_logits.float())`) and the load-balancing loss (float32
accumulators). `float64_reference(hf)` lifts all four — same formulas, float64 — for fp64 parity, and
selects HF's "eager" experts (MixtralExperts' per-expert loop: torch's grouped_mm, HF's default, has
no float64). fp32 comparisons use HF as shipped (grouped_mm).
"""

from __future__ import annotations

import types
from unittest import mock

import torch
import torch.nn.functional as F
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral import modeling_mixtral

from steps.models import hf_convert, llama_convert
from steps.models.gpt import GPTConfig, GPTLMHeadModel

# HF computes the load-balancing loss only when asked (and its masked variant fails under generate's
# KV cache in transformers 5.23), so the parity forward asks for it and generation does not
HF_FORWARD_KWARGS = {"output_router_logits": True}
HF_MODULES = {**llama_convert.HF_MODULES, "router": "model.layers.{i}.mlp.gate"}
_BLOCK = {k: v for k, v in llama_convert._BLOCK.items() if not k.startswith("mlp.")} | {"mlp.gate": "mlp.gate"}
_EXPERTS = ".mlp.experts."
_HF_LOAD_BALANCING_LOSS = modeling_mixtral.load_balancing_loss_func


def _block_prefix(key: str, old: str, new: str) -> str:
    return new + key[len(old) :]


def ours_to_hf_state_dict(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        if _EXPERTS not in k:
            out[llama_convert._rename(k, llama_convert._TOP, _BLOCK, "transformer.h.", "model.layers.")] = v
        elif k.endswith(_EXPERTS + "c_fc"):  # (E, H, C) up; HF's gate_up_proj = [gate; up] on dim 1
            pre = _block_prefix(k[: -len("c_fc")], "transformer.h.", "model.layers.")
            out[pre + "gate_up_proj"] = torch.cat([sd[k[: -len("c_fc")] + "c_fc2"], v], dim=1)  # (E, 2H, C)
        elif k.endswith(_EXPERTS + "c_proj"):
            out[_block_prefix(k[: -len("c_proj")], "transformer.h.", "model.layers.") + "down_proj"] = v
        elif not k.endswith(_EXPERTS + "c_fc2"):
            raise KeyError(f"mixtral_convert: no counterpart for {k!r}")
    return out


def hf_to_ours_state_dict(sd: dict) -> dict:
    top, block = ({v: k for k, v in d.items()} for d in (llama_convert._TOP, _BLOCK))
    out = {}
    for k, v in sd.items():
        if _EXPERTS not in k:
            out[llama_convert._rename(k, top, block, "model.layers.", "transformer.h.")] = v
        elif k.endswith(_EXPERTS + "gate_up_proj"):
            pre = _block_prefix(k[: -len("gate_up_proj")], "model.layers.", "transformer.h.")
            out[pre + "c_fc2"], out[pre + "c_fc"] = v.chunk(2, dim=1)  # (E, H, C) each
        elif k.endswith(_EXPERTS + "down_proj"):
            out[_block_prefix(k[: -len("down_proj")], "model.layers.", "transformer.h.") + "c_proj"] = v
        else:
            raise KeyError(f"mixtral_convert: no counterpart for {k!r}")
    return out


def config_from_hf(hf: MixtralConfig) -> GPTConfig:
    rope = hf.rope_parameters or {}
    unsupported = {
        "hidden_act": (hf.hidden_act, "silu"),
        "sliding_window": (hf.sliding_window, None),
        "router_jitter_noise": (hf.router_jitter_noise, 0.0),
        "rope_type": (rope.get("rope_type", "default"), "default"),
        "head_dim": (hf.head_dim or hf.hidden_size // hf.num_attention_heads, hf.hidden_size // hf.num_attention_heads),
        "attention_dropout": (hf.attention_dropout, 0.0),
    }
    bad = {k: got for k, (got, want) in unsupported.items() if got != want}
    if bad:
        raise ValueError(
            f"MixtralConfig {bad} unsupported: ours needs { ({k: w for k, (_, w) in unsupported.items()}) }"
        )
    return llama_convert.rope_gpt_config(
        hf,
        rope,
        moe={
            "experts": hf.num_local_experts,
            "top_k": hf.num_experts_per_tok,
            "aux_loss_coef": hf.router_aux_loss_coef,
            "capacity_factor": None,
            "norm_topk_prob": True,
        },
    )


def hf_config_from_ours(c: GPTConfig) -> MixtralConfig:
    if not c.moe or c.moe["capacity_factor"] is not None or not c.moe["norm_topk_prob"]:
        raise ValueError(
            "a Mixtral equivalent needs GPTConfig.moe with capacity_factor null (HF drops no tokens) and norm_topk_prob"
        )
    llama = llama_convert.hf_config_from_ours(c).to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    return MixtralConfig(
        **{k: llama[k] for k in keep},
        num_key_value_heads=c.kv_heads,
        max_position_embeddings=c.block_size,
        rms_norm_eps=c.layer_norm_eps,
        rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_weights,
        num_local_experts=c.moe["experts"],
        num_experts_per_tok=c.moe["top_k"],
        router_aux_loss_coef=c.moe["aux_loss_coef"],
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def from_hf(hf_model) -> GPTLMHeadModel:
    """Ours with the weights, dtype and device of an HF MixtralForCausalLM."""
    return hf_convert.ours_like(hf_model, config_from_hf(hf_model.config), hf_to_ours_state_dict(hf_model.state_dict()))


def to_hf(model: GPTLMHeadModel) -> MixtralForCausalLM:
    hf = hf_convert.hf_like(model, MixtralForCausalLM, hf_config_from_ours(model.config))
    hf.load_state_dict(ours_to_hf_state_dict(model.state_dict()), strict=True)
    return hf.eval()


def _router_forward(self, hidden_states):  # MixtralTopKRouter.forward without the float32 softmax
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    top_value, top_index = torch.topk(F.softmax(router_logits, dim=-1), self.top_k, dim=-1)
    return router_logits, top_value / top_value.sum(dim=-1, keepdim=True), top_index


def _load_balancing_loss64(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """HF's load_balancing_loss_func (no-mask branch) with float64 accumulators instead of float32. With
    a mask (HF's generate passes one; parity compares the loss without) HF's own function runs."""
    if attention_mask is not None or not isinstance(gate_logits, tuple):
        return _HF_LOAD_BALANCING_LOSS(gate_logits, num_experts, top_k, attention_mask)
    tokens_per_expert_sum = router_prob_sum = 0.0
    total_rows = 0
    for layer_gate in gate_logits:
        routing_weights = F.softmax(layer_gate, dim=-1)
        _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
        tokens_per_expert_sum = tokens_per_expert_sum + torch.histc(
            selected_experts.reshape(-1).double(), bins=num_experts, min=0, max=num_experts
        )
        router_prob_sum = router_prob_sum + routing_weights.sum(dim=0)
        total_rows += routing_weights.shape[0]
    return torch.sum((tokens_per_expert_sum / total_rows) * (router_prob_sum / total_rows).unsqueeze(0)) * num_experts


def _forward64(self, *args, **kwargs):  # MixtralForCausalLM.forward with the float64 loss function above
    with mock.patch.object(modeling_mixtral, "load_balancing_loss_func", _load_balancing_loss64):
        return MixtralForCausalLM.forward(self, *args, **kwargs)


def float64_reference(hf: MixtralForCausalLM) -> MixtralForCausalLM:
    """In place: HF's float32 RMSNorm, RoPE tables, router softmax and load-balancing loss lifted to
    float64 (see the module docstring)."""
    llama_convert.float64_reference(hf)
    for m in hf.modules():
        if type(m).__name__ == "MixtralTopKRouter":
            m.forward = types.MethodType(_router_forward, m)
    hf.forward = types.MethodType(_forward64, hf)
    hf.config._experts_implementation = "eager"  # the per-expert loop; the default grouped_mm has no float64
    return hf
