"""A model's shape (the config's `scale.models.<name>`) and what follows from it alone: parameter
counts by group and model FLOPs per token. No torch import: the analytic side and the step-time
model read these, the fake-world run builds the real module from the same shape (build.py).

Families: `llama` (HF LlamaForCausalLM: RMSNorm, RoPE, SwiGLU with its own hidden size `ffn`,
grouped-query attention with `n_kv_head`, no biases, untied head) and `gpt2` (our GPT,
steps/models/gpt.py: LayerNorm with bias, learned positions, GELU MLP of 4d, tied head).

Mixtures of experts (`experts` > 0): a llama-family layer whose SwiGLU is `experts` SwiGLUs of
`ffn` and a router (d × experts), each token using `top_k` of them; declared in the config by the
name of one of steps/models/shapes.py's shapes (`{shape: mixtral-8x7b}`, `Shape.named`), never
retyped, and simulated on our GPT with that shape's GPTConfig (its MoE: steps/models/moe.py).
"""

from __future__ import annotations

from dataclasses import dataclass


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
    def named_shape(cls, name: str, shape_name: str) -> "Shape":
        """A shape of steps/models/shapes.py (its GPTConfig; llama family: RMSNorm, RoPE, SwiGLU, untied)."""
        from steps.models.shapes import SHAPES, shape  # torch: only where a config names a shape

        if shape_name not in SHAPES:
            raise KeyError(f"scale.models.{name}.shape = {shape_name!r}: not a shape of steps/models/shapes.py "
                           f"(known: {', '.join(SHAPES)})")  # fmt: skip
        c = shape(shape_name)
        if c.mlp != "swiglu" or c.norm != "rmsnorm" or c.tie_weights:
            raise ValueError(f"scale.models.{name}: shape {shape_name!r} is not llama-like; declare it by family")
        moe = c.moe or {}
        return cls(
            name, "llama", c.n_embd, c.n_layer, c.n_head, c.kv_heads, c.mlp_width, c.vocab_size, c.block_size,
            moe.get("experts", 0), moe.get("top_k", 0), shape_name,
        )  # fmt: skip

    @classmethod
    def from_config(cls, name: str, spec: dict) -> "Shape":
        if spec.get("shape"):
            return cls.named_shape(name, spec["shape"])
        fam = spec["family"]
        ffn = spec.get("ffn") or 4 * spec["d"]
        return cls(
            name, fam, spec["d"], spec["layers"], spec["heads"], spec.get("kv_heads") or spec["heads"], ffn,
            spec["vocab"], spec["max_seq"],
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
        return 6 * n + 12 * self.layers * self.d * seq
