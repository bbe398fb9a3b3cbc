"""Named full-size model shapes as GPTConfig keyword arguments: GPT-2 124M/350M/774M/1.5B,
Llama-3 8B/70B (Llama-3.1-8B: the 8B shape with a 128 k context) and two mixtures of experts:
Mixtral-8x7B (8 large experts, top-2) and OLMoE-1B-7B (fine-grained: 64 small experts, top-8, as
DeepSeekMoE / Qwen-MoE split the FFN, without their shared experts).

    from steps.models.shapes import shape, SHAPES, PUBLISHED_PARAMS, param_count
    cfg = shape("llama-3-8b")                    # a GPTConfig
    cfg = shape("gpt2-124m", block_size=256)     # with overrides
    param_count("llama-3-70b")                   # built on the meta device: nothing is allocated

Sources. GPT-2: Radford et al. 2019 and HF's gpt2/gpt2-medium/-large/-xl config.json (vocab
50257, context 1024, tied head, tanh GELU, LayerNorm eps 1e-5). Llama 3: Meta's params.json and
HF's Meta-Llama-3-8B / -70B config.json (vocab 128256, rope_theta 500000, 8 kv heads, SwiGLU
14336 / 28672, RMSNorm eps 1e-5, untied head, context 8192; 3.1: 131072). Llama-3.1's "llama3"
RoPE frequency scaling (for contexts past 8192) is not implemented here: the 3.1 shape has the
right parameters, memory and FLOPs, not 3.1's long-context positions.

MoE. Mixtral-8x7B: Jiang et al. 2024 and HF's Mixtral-8x7B-v0.1 config.json (vocab 32000, C 4096,
32 layers, 32 heads / 8 kv, 8 SwiGLU experts of 14336, top-2, rope_theta 1e6, context 32768, untied).
OLMoE-1B-7B: Muennighoff et al. 2024 and HF's allenai/OLMoE-1B-7B-0924 config.json (vocab 50304,
C 2048, 16 layers, 16 heads, 64 experts of 1024, top-8 without renormalisation, context 4096,
untied). OLMoE also RMS-normalises q and k (QK-norm, 2·C weights a layer): ours has no QK-norm, so
the shape has 65,536 fewer parameters (0.001 %) and a different attention; memory and FLOPs hold.
active_param_count: the parameters one token uses (top_k of E experts).

PUBLISHED_PARAMS holds the counts published with the weights (GPT-2 124M with the tied wte counted
once; the Llama safetensors totals); tests/test_model_shapes.py checks every shape against those and
against HF's GPT2LMHeadModel / LlamaForCausalLM built on the meta device from the same sizes.
"""

from __future__ import annotations

import torch

from steps.models.gpt import GPTConfig, GPTLMHeadModel

GPT2 = dict(vocab_size=50257, block_size=1024, activation="gelu_new", layer_norm_eps=1e-5, bias=True, tie_weights=True)
LLAMA3 = dict(
    vocab_size=128256,
    block_size=8192,
    pos="rope",
    rope_theta=500000.0,
    norm="rmsnorm",
    layer_norm_eps=1e-5,
    mlp="swiglu",
    n_kv_head=8,
    bias=False,
    tie_weights=False,
)

SHAPES: dict[str, dict] = {
    "gpt2-124m": dict(GPT2, n_layer=12, n_head=12, n_embd=768),
    "gpt2-350m": dict(GPT2, n_layer=24, n_head=16, n_embd=1024),
    "gpt2-774m": dict(GPT2, n_layer=36, n_head=20, n_embd=1280),
    "gpt2-1.5b": dict(GPT2, n_layer=48, n_head=25, n_embd=1600),
    "llama-3-8b": dict(LLAMA3, n_layer=32, n_head=32, n_embd=4096, mlp_hidden=14336),
    "llama-3.1-8b": dict(LLAMA3, n_layer=32, n_head=32, n_embd=4096, mlp_hidden=14336, block_size=131072),
    "llama-3-70b": dict(LLAMA3, n_layer=80, n_head=64, n_embd=8192, mlp_hidden=28672),
    "mixtral-8x7b": dict(
        LLAMA3,
        vocab_size=32000,
        block_size=32768,
        rope_theta=1e6,
        n_layer=32,
        n_head=32,
        n_embd=4096,
        mlp_hidden=14336,
        moe={"experts": 8, "top_k": 2, "aux_loss_coef": 0.02},
    ),
    "olmoe-1b-7b": dict(
        LLAMA3,
        vocab_size=50304,
        block_size=4096,
        rope_theta=10000.0,
        n_kv_head=16,
        n_layer=16,
        n_head=16,
        n_embd=2048,
        mlp_hidden=1024,
        moe={"experts": 64, "top_k": 8, "aux_loss_coef": 0.01, "norm_topk_prob": False},
    ),
}

PUBLISHED_PARAMS = {
    "gpt2-124m": 124_439_808,
    "llama-3-8b": 8_030_261_248,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mixtral-8x7b": 46_702_792_704,  # "46.7B"; 12.9 B active
}
PUBLISHED_ACTIVE_PARAMS = {"mixtral-8x7b": 12.9e9, "olmoe-1b-7b": 1.3e9}  # as rounded in the papers


def shape(name: str, **overrides) -> GPTConfig:
    """The GPTConfig of a named shape; `overrides` replace fields (e.g. block_size, dropout)."""
    if name not in SHAPES:
        raise KeyError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    return GPTConfig(**{**SHAPES[name], **overrides})


def meta_model(name_or_config: str | GPTConfig) -> GPTLMHeadModel:
    """The model on the meta device: real parameter shapes, no storage."""
    cfg = shape(name_or_config) if isinstance(name_or_config, str) else name_or_config
    with torch.device("meta"):
        return GPTLMHeadModel(cfg)


def param_count(name_or_config: str | GPTConfig) -> int:
    """Total parameters (a tied head counted once), including position embeddings."""
    return meta_model(name_or_config).num_params(non_embedding=False)


def active_param_count(name_or_config: str | GPTConfig) -> int:
    """Parameters one token uses: all but the (E - top_k) / E of each MoE layer's experts it skips."""
    model = meta_model(name_or_config)
    n = model.num_params(non_embedding=False)
    moe = model.config.moe
    if moe:
        experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
        n -= experts * (moe["experts"] - moe["top_k"]) // moe["experts"]
    return n
