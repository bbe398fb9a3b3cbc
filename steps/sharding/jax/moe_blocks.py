"""Expert parallelism in JAX: MoE blocks (x + moe(x): a top-k router and E GELU experts, as
steps/models/moe.py with norm_topk_prob) under jax.shard_map, the experts' (E, ...) weights sharded
P("ep") on their first dim, the batch on its first, the router replicated.

XLA wants static shapes, so the dispatch is GShard's (Lepikhin et al. 2020) rather than the torch
engines' ragged one: every rank scatters its n tokens' n·k assignments into a dense (E, cap, C)
buffer (zeros where an expert got fewer rows), `jax.lax.all_to_all` over "ep" sends expert block d
(E/N experts) to rank d, the local experts run on (N, E/N, cap, C), and the reverse all_to_all brings
the outputs home; the combine reads each assignment's row back and weights it. cap = n (a token
picks an expert at most once), so no assignment is ever dropped: one device (N = 1, the same
function) is the sharding reference, and the torch MoE (steps/models/moe.py, ragged dispatch,
checked against HF Mixtral) on the same weights the independent one (torch_reference; measured
4e-16 in fp64, 2e-7 in fp32). The price: every all-to-all moves E·cap·C numbers, k·n·C of them
real (E/k times the ragged dispatch's bytes here) — why production systems pick a capacity factor.
Autodiff transposes each all_to_all into the reverse one; the router's gradient is summed over
"ep" as a replicated parameter's is. Loss: MSE of the blocks' output against a fixed target.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from steps.analytic import costs
from steps.sharding.plan import Plan

EXPERT_PARAMS = ("mlp.experts.c_fc", "mlp.experts.c_proj")


def names_and_shapes(plan: Plan) -> dict[str, tuple]:
    g = plan.gpt
    C, E = g["n_embd"], g["moe"]["experts"]
    out = {}
    for i in range(g["n_layer"]):
        pre = f"transformer.h.{i}."
        out[pre + "mlp.gate.weight"] = (E, C)
        out[pre + "mlp.experts.c_fc"], out[pre + "mlp.experts.c_proj"] = (E, 4 * C, C), (E, C, 4 * C)
    return out


def moe_block(p: dict, x, top_k: int, ep_axis=None):
    """x + the MoE's output, for this device's tokens x (B, T, C); p: this device's weights."""
    B, T, C = x.shape
    E = p["gate.weight"].shape[0]
    xf = x.reshape(-1, C)  # (n, C)
    n = xf.shape[0]
    probs = jax.nn.softmax(xf @ p["gate.weight"].T, axis=-1)  # (n, E)
    top_p, top_i = jax.lax.top_k(probs, top_k)  # (n, k)
    weight = (top_p / top_p.sum(-1, keepdims=True)).reshape(-1, 1)  # (n·k, 1)
    expert = jax.nn.one_hot(top_i.reshape(-1), E, dtype=x.dtype)  # (n·k, E) token-major assignments
    slot = ((jnp.cumsum(expert, 0) - 1) * expert).sum(-1).astype(jnp.int32)  # (n·k,) place in its expert's queue
    where = expert[:, :, None] * jax.nn.one_hot(slot, n, dtype=x.dtype)[:, None, :]  # (n·k, E, cap=n)
    buf = jnp.einsum("aes,ac->esc", where, jnp.repeat(xf, top_k, axis=0))  # (E, cap, C) dispatched rows
    if ep_axis:  # expert block d -> rank d; received blocks stacked by source rank
        buf = jax.lax.all_to_all(buf, ep_axis, 0, 0, tiled=True)  # (N·E/N, cap, C): [source, local expert]
    w1, w2 = p["experts.c_fc"], p["experts.c_proj"]  # (E/N, 4C, C), (E/N, C, 4C) local experts
    rows = buf.reshape(-1, w1.shape[0], n, C)  # (N, E/N, cap, C)
    h = jax.nn.gelu(jnp.einsum("wesc,ehc->wesh", rows, w1), approximate=True)
    out = jnp.einsum("wesh,ech->wesc", h, w2).reshape(E, n, C)  # (E, cap, C)
    if ep_axis:  # the outputs back to their tokens' ranks, in global expert order
        out = jax.lax.all_to_all(out, ep_axis, 0, 0, tiled=True)
    y = jnp.einsum("aes,esc->ac", where, out) * weight  # (n·k, C) each assignment's weighted output
    return x + y.reshape(n, top_k, C).sum(1).reshape(B, T, C)


class MoEBlocksModel:
    """What the JAX engine needs of a model (jax/toy_mlp.py's shape): init, spec, batch, forward, analytic."""

    def init(self, plan: Plan) -> dict:
        rng = np.random.default_rng(plan.seed)
        return {k: rng.normal(0, s[-1] ** -0.5, s) for k, s in names_and_shapes(plan).items()}

    def spec(self, plan: Plan, name: str):
        return P("ep") if plan.strategy == "ep" and name.endswith(EXPERT_PARAMS) else P()

    def batch(self, plan: Plan, t: int):
        g = plan.gpt
        rng = np.random.default_rng([plan.seed, t])
        x = rng.normal(size=(plan.batch_size, g["block_size"], g["n_embd"]))
        return x, np.tanh(x[..., ::-1].copy())

    def forward(self, plan: Plan, params, x, tp, gather, ep=None):
        for i in range(plan.gpt["n_layer"]):
            pre = f"transformer.h.{i}.mlp."
            x = moe_block(
                {k[len(pre) :]: w for k, w in params.items() if k.startswith(pre)}, x, plan.gpt["moe"]["top_k"], ep
            )
        return x

    def analytic(self, plan: Plan, shapes: dict) -> dict:
        router = sum(v for k, v in shapes.items() if not k.endswith(EXPERT_PARAMS))
        return costs.gshard_moe_costs(plan, router, sum(shapes.values()) - router)

    def torch_reference(self, plan: Plan):
        """The same blocks in torch on one device: steps/models/moe.py's MoE (router, top-k,
        renormalised weights, stacked GELU experts), same weights and batches (cross-backend parity)."""
        from steps.sharding.reference import moe_blocks_reference  # torch only for a cross-backend cell

        return moe_blocks_reference(plan, self.init(plan), [self.batch(plan, t) for t in range(plan.steps)])
