"""Named full-size model shapes as GPTConfig keyword arguments: GPT-2 124M/350M/774M/1.5B,
Llama-3 8B/70B (Llama-3.1-8B: the 8B shape with a 128 k context) and two mixtures of experts:
Mixtral-8x7B (8 large experts, top-2) and OLMoE-1B-7B (fine-grained: 64 small experts, top-8, as
DeepSeekMoE / Qwen-MoE split the FFN, without their shared experts).

    from steps.models.shapes import shape, SHAPES, PUBLISHED_PARAMS, param_count, Shape
    cfg = shape("llama-3-8b")                    # a GPTConfig
    cfg = shape("gpt2-124m", block_size=256)     # with overrides
    param_count("llama-3-70b")                   # built on the meta device: nothing is allocated
    Shape.of("llama-3-70b")                      # the same shape as the analytic model reads it (no torch)

The one registry of model shapes: the scale stage's cells name one (`model: llama-3.1-8b`), the
simulator builds it (steps/scale/recipe.py) and the analytic model (steps/analytic/) reads its Shape.
Importing this module imports no torch (GPTConfig and the meta-device model are imported where
they are built), so the scale stage's analytic cells stay torch-free.

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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from steps.analytic.flops import flops_per_token

if TYPE_CHECKING:
    from steps.models.gpt import GPTConfig, GPTLMHeadModel

# the families the analytic model knows (Shape.family) state these GPTConfig fields: GPT-2 spells
# out GPTConfig's defaults so that a Shape can be read from this table without importing torch
GPT2 = dict(
    vocab_size=50257, block_size=1024, activation="gelu_new", layer_norm_eps=1e-5, bias=True, tie_weights=True,
    pos="learned", norm="layernorm", mlp="gelu",
)  # fmt: skip
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


def known(name: str, where: str) -> None:
    """Raise a KeyError naming `where` (the config field or caller) and the known shapes."""
    if name not in SHAPES:
        raise KeyError(f"{where} = {name!r} is not a shape of steps/models/shapes.py (known: {', '.join(SHAPES)})")


def shape(name: str, **overrides) -> GPTConfig:
    """The GPTConfig of a named shape; `overrides` replace fields (e.g. block_size, dropout)."""
    from steps.models.gpt import GPTConfig

    known(name, "model shape")
    return GPTConfig(**{**SHAPES[name], **overrides})


def meta_model(name_or_config: str | GPTConfig) -> GPTLMHeadModel:
    """The model on the meta device: real parameter shapes, no storage."""
    import torch

    from steps.models.gpt import GPTLMHeadModel

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


# ---- the analytic model's view of a shape ---------------------------------------------------------
# Families: `llama` (HF LlamaForCausalLM: RMSNorm, RoPE, SwiGLU with its own hidden size `ffn`,
# grouped-query attention with `n_kv_head`, no biases, untied head) and `gpt2` (our GPT,
# steps/models/gpt.py: LayerNorm with bias, learned positions, GELU MLP of 4d, tied head).
#
# Mixtures of experts (`experts` > 0): a llama-family layer whose SwiGLU is `experts` SwiGLUs of
# `ffn` and a router (d × experts), each token using `top_k` of them; simulated on our GPT with the
# shape's GPTConfig (its MoE: steps/models/moe.py).
@dataclass(frozen=True)
class Shape:
    name: str
    family: str  # llama | gpt2
    d: int  # hidden size
    layers: int
    heads: int
    kv_heads: int
    ffn: int  # MLP hidden size (gpt2: 4d)
    vocab: int
    max_seq: int
    experts: int = 0  # MoE: experts per layer (0: a dense MLP)
    top_k: int = 0  # MoE: experts per token
    named: str = ""  # the steps/models/shapes.py shape it came from (MoE: the module built)

    @classmethod
    def of(cls, name: str, where: str = "model shape", **overrides) -> "Shape":
        """The registry's shape `name` (SHAPES), `overrides` replacing GPTConfig fields (a dense shape
        only: the simulator builds an MoE from its registry name); an unknown name is a KeyError
        naming `where` (the config field) and the known shapes."""
        known(name, where)
        if overrides and SHAPES[name].get("moe"):
            raise ValueError(f"{where} = {name!r}: an MoE shape is simulated as named, without overrides")
        label = name + "".join(f" {k}={v}" for k, v in overrides.items())
        return replace(cls.from_fields(label, {**SHAPES[name], **overrides}), named=name)

    @classmethod
    def from_fields(cls, name: str, c: dict) -> "Shape":
        """The shape of GPTConfig keyword arguments `c` (a SHAPES entry; tests' tiny models), which
        must state the fields that make a family: llama = RMSNorm, RoPE, SwiGLU with its mlp_hidden,
        no biases, untied head; gpt2 = our GPT's defaults (LayerNorm, learned positions, GELU MLP of
        4d unless mlp_hidden says otherwise, biases, tied head). MoE: `moe` {experts, top_k}."""
        family = {
            ("rmsnorm", "rope", "swiglu", False, False): "llama",
            ("layernorm", "learned", "gelu", True, True): "gpt2",
        }.get(tuple(c.get(k) for k in ("norm", "pos", "mlp", "bias", "tie_weights")))
        if family is None or (family == "llama" and not c.get("mlp_hidden")):
            raise ValueError(
                f"model shape {name!r} is neither llama-like (norm rmsnorm, pos rope, mlp swiglu with its "
                "mlp_hidden, bias false, tie_weights false) nor gpt2-like (layernorm, learned, gelu, bias, tied): "
                "the analytic model knows those two families"
            )
        moe = c.get("moe") or {}
        return cls(
            name, family, c["n_embd"], c["n_layer"], c["n_head"], c.get("n_kv_head") or c["n_head"],
            c.get("mlp_hidden") or 4 * c["n_embd"], c["vocab_size"], c["block_size"],
            moe.get("experts", 0), moe.get("top_k", 0), name,
        )  # fmt: skip

    @property
    def head_dim(self) -> int:
        return self.d // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    # ---- parameters ------------------------------------------------------------------------
    def groups(self) -> dict[str, int]:
        """Parameter count per group: embed, pos, layers (all L), norm_f, head (0 when tied)."""
        d, f = self.d, self.ffn
        if self.family == "llama":
            attn = d * d + 2 * d * self.kv_dim + d * d
            mlp = self.experts * (3 * d * f + d) if self.experts else 3 * d * f  # MoE: E SwiGLUs + the router
            layer = attn + mlp + 2 * d
            return {
                "embed": self.vocab * d,
                "pos": 0,
                "layers": self.layers * layer,
                "norm_f": d,
                "head": self.vocab * d,
            }
        layer = (4 * d * d + 4 * d) + (2 * d * f + f + d) + 4 * d  # q/k/v/o (+bias), c_fc/c_proj (+bias), 2 LN
        return {
            "embed": self.vocab * d,
            "pos": self.max_seq * d,
            "layers": self.layers * layer,
            "norm_f": 2 * d,
            "head": 0,
        }

    @property
    def params(self) -> int:
        return sum(self.groups().values())

    def expert_params(self) -> int:
        """Parameters of all layers' experts (0 for a dense shape): what expert parallelism shards."""
        return self.layers * self.experts * 3 * self.d * self.ffn

    def active_params(self) -> int:
        """Parameters one token uses: all but the (E - top_k)/E of the experts it skips."""
        return self.params - (self.expert_params() * (self.experts - self.top_k) // self.experts if self.experts else 0)

    def layer_replicated(self) -> int:
        """Parameters of one layer that TP keeps whole on every rank. Llama (torchtitan's plan):
        its two RMSNorms. Our GPT (parallelize.apply_tp): two LayerNorms (weight + bias) and the
        biases of the row-parallel o_proj and c_proj."""
        return 2 * self.d if self.family == "llama" else 6 * self.d

    def ends(self) -> dict[str, int]:
        """The groups outside the layers, as TP leaves them on one rank: (sharded, whole). Llama's
        embedding and head are vocabulary-parallel; our GPT keeps wte (= the tied head) and wpe."""
        g = self.groups()
        if self.family == "llama":
            return {"first": (g["embed"], 0), "last": (g["head"], g["norm_f"])}
        return {"first": (0, g["embed"] + g["pos"]), "last": (0, g["embed"] + g["norm_f"])}

    # ---- FLOPs --------------------------------------------------------------------------------
    def flops_per_token(self, seq: int) -> float:
        """Model FLOPs of one token's forward + backward, torchtitan's convention (its MFU):
        6·N (N without the embedding table, which is a lookup) + 12·L·d·T for attention
        (QKᵀ and AV, forward and backward, causal masking not discounted). MoE: N is the active
        parameters (top_k of E experts a token; the router's d·E counted whole)."""
        g = self.groups()
        n = (
            self.active_params() - g["embed"] - g["pos"] + (g["embed"] if self.family == "gpt2" else 0)
        )  # tied head is a matmul
        return flops_per_token(n, self.layers, self.d, seq)
