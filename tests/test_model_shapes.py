"""Named full-size shapes (steps/models/shapes.py, the one registry): parameter counts on the meta
device against the published counts and against HF's GPT2LMHeadModel / LlamaForCausalLM /
MixtralForCausalLM / OlmoeForCausalLM built from the same sizes; the analytic model's Shape of each
against the GPTConfig; the scale config naming shapes, an unknown name failing validation."""

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
)

from steps.models.mlp import swiglu_hidden
from steps.models.shapes import (
    PUBLISHED_ACTIVE_PARAMS,
    PUBLISHED_PARAMS,
    SHAPES,
    Shape,
    active_param_count,
    meta_model,
    param_count,
    shape,
)
from tests.conftest import DEFAULT

# The reference, written from HF's published config.json files, not from our table
GPT2_HF = {
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-350m": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-774m": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-1.5b": dict(n_layer=48, n_head=25, n_embd=1600),
}
LLAMA_HF = {
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32),
    "llama-3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64),
}

MOE_HF = {  # HF's mistralai/Mixtral-8x7B-v0.1 and allenai/OLMoE-1B-7B-0924 config.json
    "mixtral-8x7b": lambda: MixtralForCausalLM(
        MixtralConfig(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
        )
    ),
    "olmoe-1b-7b": lambda: OlmoeForCausalLM(
        OlmoeConfig(
            vocab_size=50304,
            hidden_size=2048,
            intermediate_size=1024,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=64,
            num_experts_per_tok=8,
        )
    ),
}
QK_NORM = {"olmoe-1b-7b": 16 * 2 * 2048}  # OLMoE's q_norm + k_norm weights, which ours lacks


def hf_count(name: str) -> int:
    with torch.device("meta"):
        if name in MOE_HF:
            return MOE_HF[name]().num_parameters()
        if name in GPT2_HF:
            return GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, **GPT2_HF[name])).num_parameters()
        cfg = LlamaConfig(vocab_size=128256, num_key_value_heads=8, tie_word_embeddings=False, **LLAMA_HF[name])
        return LlamaForCausalLM(cfg).num_parameters()


def test_every_shape_has_an_hf_reference():
    assert set(SHAPES) == set(GPT2_HF) | set(LLAMA_HF) | set(MOE_HF)


@pytest.mark.parametrize("name", SHAPES)
def test_param_count_equals_published_and_hf(name):
    n = param_count(name)
    assert n == hf_count(name) - QK_NORM.get(name, 0)
    if name in PUBLISHED_PARAMS:
        assert n == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("name", PUBLISHED_ACTIVE_PARAMS)
def test_moe_active_params_match_the_papers(name):
    """Mixtral "12.9B active", OLMoE "1.3B active" (rounded to 0.1 B in the papers)."""
    assert abs(active_param_count(name) - PUBLISHED_ACTIVE_PARAMS[name]) < 0.05e9
    m = meta_model(name)
    assert m.transformer.h[0].mlp.experts.c_fc.shape == (m.config.moe["experts"], m.config.mlp_width, m.config.n_embd)
    assert active_param_count("llama-3-8b") == param_count("llama-3-8b")


def test_published_counts():
    assert PUBLISHED_PARAMS["gpt2-124m"] == 124_439_808
    assert PUBLISHED_PARAMS["llama-3-8b"] == PUBLISHED_PARAMS["llama-3.1-8b"] == 8_030_261_248
    assert PUBLISHED_PARAMS["llama-3-70b"] == 70_553_706_496


def test_llama3_shape_fields():
    c = shape("llama-3-8b")
    assert (c.vocab_size, c.rope_theta, c.n_kv_head, c.mlp_width, c.layer_norm_eps) == (128256, 5e5, 8, 14336, 1e-5)
    assert (c.pos, c.norm, c.mlp, c.bias, c.tie_weights) == ("rope", "rmsnorm", "swiglu", False, False)
    assert shape("llama-3.1-8b").block_size == 131072 and c.block_size == 8192
    # the SwiGLU widths follow Meta's rule with Llama 3's ffn_dim_multiplier 1.3
    assert swiglu_hidden(4096, 1024, 1.3) == 14336 and swiglu_hidden(8192, 4096, 1.3) == 28672
    assert shape("llama-3-70b").mlp_width == 28672


def test_shape_overrides_meta_and_unknown_name():
    assert shape("gpt2-124m", block_size=256).block_size == 256
    m = meta_model("llama-3-70b")
    assert {p.device.type for p in m.parameters()} == {"meta"}
    assert m.transformer.h[0].attn.k_proj.weight.shape == (1024, 8192)  # 8 kv heads × 128
    gpt2 = meta_model("gpt2-124m")
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight and m.lm_head.weight is not m.transformer.wte.weight
    with pytest.raises(KeyError, match="known: gpt2-124m"):
        shape("llama-4")


# ---- the analytic model's view of the same registry (steps.models.shapes.Shape, torch-free) ---------
@pytest.mark.parametrize("name", SHAPES)
def test_analytic_shape_counts_what_the_model_holds(name):
    """Shape.of reads the registry's GPTConfig fields without torch: its sizes are the GPTConfig's and
    its parameter counts (total, active, experts) the meta-device model's."""
    s, c = Shape.of(name), shape(name)
    assert (s.d, s.layers, s.heads, s.kv_heads, s.ffn, s.vocab, s.max_seq) == (
        c.n_embd, c.n_layer, c.n_head, c.kv_heads, c.mlp_width, c.vocab_size, c.block_size,
    )  # fmt: skip
    assert (s.experts, s.top_k) == ((c.moe["experts"], c.moe["top_k"]) if c.moe else (0, 0))
    assert s.family == ("llama" if c.norm == "rmsnorm" else "gpt2") and s.named == name
    assert s.params == param_count(name) and s.active_params() == active_param_count(name)
    experts = sum(p.numel() for k, p in meta_model(name).named_parameters() if ".mlp.experts." in k)
    assert s.expert_params() == experts


def test_analytic_shape_overrides_and_unknown_names():
    tiny = Shape.of("llama-3-8b", n_embd=64, n_layer=2, n_head=4, n_kv_head=2, mlp_hidden=96, vocab_size=128)
    assert tiny.params == param_count(shape("llama-3-8b", n_embd=64, n_layer=2, n_head=4, n_kv_head=2,
                                            mlp_hidden=96, vocab_size=128))  # fmt: skip
    assert tiny.named == "llama-3-8b" and tiny.name.startswith("llama-3-8b n_embd=64")
    with pytest.raises(ValueError, match="MoE shape is simulated as named"):
        Shape.of("mixtral-8x7b", n_layer=2)
    with pytest.raises(KeyError, match=r"scale.cells.c.model = 'llama3.1-8b' .*known: gpt2-124m, .*llama-3.1-8b"):
        Shape.of("llama3.1-8b", "scale.cells.c.model")
    with pytest.raises(ValueError, match="neither llama-like"):
        Shape.from_fields("odd", dict(SHAPES["llama-3-8b"], tie_weights=True))


def test_config_names_shapes_and_validation_lists_the_known_ones():
    """The scale schema's `model` enum is the registry's names; a config naming another shape fails
    validation with the file, the cell's field and the known names."""
    from steps.config import ConfigError, load_config, load_schema

    enum = load_schema()["properties"]["scale"]["properties"]["model"]["enum"]
    assert enum == ["", *SHAPES]
    with pytest.raises(ConfigError, match=r"(?s)default.yaml, scale.cells.x.*'model' must be one of .*llama-3.1-8b"):
        load_config(DEFAULT, overrides={"scale": {"cells": {"x": {"model": "llama3.1-8b", "cluster": "dgx_h100"}}}})
    cells = load_config(DEFAULT)["scale"]["cells"]
    assert "models" not in load_config(DEFAULT)["scale"]
    assert {c["model"] for c in cells.values() if c.get("model")} <= set(SHAPES)
