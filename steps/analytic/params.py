"""Parameter counts: of a whole GPTConfig by group, and of one rank after TP, FSDP, PP and EP.

Ψ below is a parameter count. The sharding stage's plans (steps/sharding/plan.py: our MLP and GPT,
parameters named as the single-device module names them) and the scale stage's plans
(steps/scale/scale_plan.py on a steps.models.shapes.Shape) split their models the same way: TP divides
what its column- and row-parallel matmuls shard and keeps norms (and the row-parallel biases)
whole, FSDP divides by the shard axis, PP keeps one stage, EP one ep-th of the experts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: this package imports neither torch nor the plans
    from steps.models.shapes import Shape
    from steps.scale.scale_plan import ScalePlan
    from steps.sharding.plan import Plan


def param_counts(cfg) -> dict[str, int]:
    """Parameters by group for a steps.models.gpt.GPTConfig (tied LM head counted once; GELU MLP of 4d)."""
    d, V, L, b = cfg.n_embd, cfg.vocab_size, cfg.n_layer, int(cfg.bias)
    norm = d * (1 + b) if cfg.norm == "layernorm" else d
    per_layer = 4 * (d * d + b * d) + (d * 4 * d + b * 4 * d) + (4 * d * d + b * d) + 2 * norm
    return {
        "wte": V * d,
        "wpe": cfg.block_size * d if cfg.pos == "learned" else 0,
        "blocks": L * per_layer,
        "ln_f": norm,
        "lm_head": 0 if cfg.tie_weights else V * d,
    }


# ---- the sharding stage: the MLP (from scratch and JAX) ------------------------------------------
def mlp_psi(plan: Plan) -> int:
    d, h, L = plan.mlp.dim, plan.mlp.hidden, plan.mlp.layers
    return L * (2 * d * h + h + d)


def mlp_local_params(plan: Plan) -> float:
    """Parameters one rank holds: TP splits W1, b1, W2 (b2 is replicated); FSDP/PP divide by N."""
    d, h, L = plan.mlp.dim, plan.mlp.hidden, plan.mlp.layers
    t = plan.axis("tp")
    local = L * ((2 * d * h + h) / t + d)
    return local / plan.axis("fsdp") / plan.axis("pp")


# ---- the sharding stage: the GPT (native torch, and its blocks in JAX) ----------------------------
def gpt_tp_split(name: str) -> str:
    """How native TP places a GPT parameter: 'shard' (divided by tp) or 'replicate'."""
    col = ("q_proj", "k_proj", "v_proj", "c_fc", "c_fc2")  # c_fc2: SwiGLU's gate
    if any(f".{c}." in name for c in col):
        return "shard"
    if name.endswith(("o_proj.weight", "c_proj.weight")):
        return "shard"
    return "replicate"


def gpt_local_params(plan: Plan, shapes: dict[str, int], stage_params: float | None = None) -> float:
    """`shapes`: parameter name -> numel of the single-device model (tied weights once)."""
    if plan.strategy == "pp":
        return stage_params if stage_params is not None else sum(shapes.values()) / plan.axis("pp")
    t, e, f = plan.axis("tp"), plan.axis("ep"), plan.axis("fsdp")
    if e > 1 and f > 1:  # fsdp_ep: dense sharded over all f·e ranks, experts over e then f
        return sum(n / (e * f) for n in shapes.values())
    local = sum(
        n / t if gpt_tp_split(k) == "shard" else n / e if ".mlp.experts." in k else n for k, n in shapes.items()
    )
    return local / f


def gpt_stage_shapes(plan: Plan, shapes: dict[str, int], stage: int) -> dict[str, int]:
    """The single-device parameters pipeline stage `stage` of plan.axis("pp") holds: its n_layer/pp
    consecutive blocks, the embeddings on the first stage, the final norm and the (untied) head on
    the last. Read from the names alone, not from the engine's stage modules."""
    s = plan.axis("pp")
    per = plan.gpt["n_layer"] // s

    def on(name: str) -> bool:
        if name.startswith("transformer.h."):
            return int(name.split(".")[2]) // per == stage
        if name.startswith(("transformer.wte.", "transformer.wpe.")):
            return stage == 0
        return stage == s - 1  # transformer.ln_f, lm_head

    return {k: n for k, n in shapes.items() if on(k)}


# ---- the scale stage: a named shape on a ScalePlan -----------------------------------------------
def local_params(shape: Shape, plan: ScalePlan, layers_only: bool = False) -> float:
    """Parameters of one rank after TP and PP, before the data axis. With PP: the worst stage (the
    first, with the embeddings, or the last, with the head: a tied head needs its own copy there)."""
    t, p, L = plan.axis("tp"), plan.axis("pp"), shape.layers
    rep = shape.layer_replicated()
    body = ((shape.groups()["layers"] / L - rep) / t + rep) * L / p
    if layers_only:
        return body
    ends = {k: sharded / t + whole for k, (sharded, whole) in shape.ends().items()}
    if p > 1:
        return body + max(ends.values())
    g = shape.groups()
    if shape.family == "gpt2":  # one tied table
        return body + g["embed"] + g["pos"] + g["norm_f"]
    return body + ends["first"] + ends["last"]
