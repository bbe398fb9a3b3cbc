"""Our GPT's transformer blocks (steps/models/gpt.py Block: pre-LN causal attention + GELU MLP)
in JAX, sharded with the MLP's specs: q/k/v/c_fc are the column-parallel W1/b1, o_proj/c_proj
weights the row-parallel W2, every norm and row-parallel bias the replicated b2. Heads stay local
under TP (n_head/tp per device), exactly as the torch attention derives them from the shape.
Loss: MSE of the blocks' output against a fixed target (no embeddings: the blocks are what shards).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from steps.analytic import costs
from steps.sharding.jax.specs import SPECS, remat
from steps.sharding.plan import Plan

LINEARS = {
    "attn.q_proj": "col",
    "attn.k_proj": "col",
    "attn.v_proj": "col",
    "attn.o_proj": "row",
    "mlp.c_fc": "col",
    "mlp.c_proj": "row",
}


def names_and_shapes(plan: Plan) -> dict[str, tuple]:
    d, out = plan.gpt["n_embd"], {}
    for i in range(plan.gpt["n_layer"]):
        pre = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[pre + ln + ".weight"], out[pre + ln + ".bias"] = (d,), (d,)
        for lin in LINEARS:
            n_out, n_in = (4 * d, d) if lin == "mlp.c_fc" else (d, 4 * d) if lin == "mlp.c_proj" else (d, d)
            out[pre + lin + ".weight"], out[pre + lin + ".bias"] = (n_out, n_in), (n_out,)
    return out


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * w + b


def gpt_block(p: dict, x, head_dim: int, tp_axis=None):
    def lin(h, name):
        return h @ p[name + ".weight"].T + p[name + ".bias"]

    def row(h, name):  # row-parallel: reduce-from-tensor-parallel-region of the partial sums over the
        # local heads / hidden units, then the bias once
        y = h @ p[name + ".weight"].T
        return (jax.lax.psum(y, tp_axis) if tp_axis else y) + p[name + ".bias"]

    def to_tp(h):  # Megatron's copy-to-tensor-parallel-region once for q, k and v: one psum of
        # their summed input grads backward, not three
        return jax.lax.pcast(h, tp_axis, to="varying") if tp_axis else h

    B, T, _ = x.shape
    h = to_tp(layer_norm(x, p["ln_1.weight"], p["ln_1.bias"]))
    q, k, v = (lin(h, f"attn.{n}_proj").reshape(B, T, -1, head_dim).transpose(0, 2, 1, 3) for n in "qkv")
    att = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(head_dim)
    att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -jnp.inf)
    y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, T, -1)
    x = x + row(y, "attn.o_proj")
    h = jax.nn.gelu(lin(to_tp(layer_norm(x, p["ln_2.weight"], p["ln_2.bias"])), "mlp.c_fc"), approximate=True)
    return x + row(h, "mlp.c_proj")


class GPTBlocksModel:
    def init(self, plan: Plan) -> dict:
        rng = np.random.default_rng(plan.seed)
        out = {}
        for k, shape in names_and_shapes(plan).items():
            base = 1.0 if k.endswith("ln_1.weight") or k.endswith("ln_2.weight") else 0.0
            out[k] = base + rng.normal(0, 0.02 if len(shape) == 1 else shape[1] ** -0.5, shape)
        return out

    def spec(self, plan: Plan, name: str):
        layer = name.rsplit(".", 1)[0].split(".", 3)[-1]  # e.g. attn.q_proj
        kind = LINEARS.get(layer)
        key = {
            "col": "w1" if name.endswith("weight") else "b1",
            "row": "w2" if name.endswith("weight") else "b2",
            None: "b2",
        }[kind]
        return SPECS[plan.strategy][key]

    def batch(self, plan: Plan, t: int):
        g = plan.gpt
        rng = np.random.default_rng([plan.seed, t])
        x = rng.normal(size=(plan.batch_size, g["block_size"], g["n_embd"]))
        return x, np.tanh(x[..., ::-1].copy())

    def forward(self, plan: Plan, params, x, tp, gather):
        hd = plan.gpt["n_embd"] // plan.gpt["n_head"]
        for i in range(plan.gpt["n_layer"]):
            pre = f"transformer.h.{i}."
            keys = [k for k in params if k.startswith(pre)]

            def f(x, *ws, keys=keys, pre=pre):
                return gpt_block({k[len(pre) :]: gather(k, w) for k, w in zip(keys, ws)}, x, hd, tp)

            x = remat(plan, f)(x, *(params[k] for k in keys))
        return x

    def analytic(self, plan: Plan, shapes: dict) -> dict:
        return costs.gpt_costs(plan, shapes)

    def torch_reference(self, plan: Plan):
        """The same blocks as torch modules from steps/models/gpt.py, same weights and batches."""
        from steps.sharding.reference import gpt_blocks_reference  # torch only for a cross-backend cell

        return gpt_blocks_reference(plan, self.init(plan), [self.batch(plan, t) for t in range(plan.steps)])
