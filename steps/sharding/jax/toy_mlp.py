"""The toy MLP in JAX (same numpy weights and batches as torch: toy_mlp_init.py), in the shape the
engine asks of a model: init, spec, batch, forward, analytic, torch_reference."""

from __future__ import annotations

import jax

from steps.analytic import costs
from steps.sharding.jax.specs import SPECS, remat
from steps.sharding.plan import Plan
from steps.sharding.toy_mlp_init import PARAM_NAMES, init_plan_mlp, make_batch


def block(x, w1, b1, w2, b2, tp_axis=None):
    y = jax.nn.relu(x @ w1.T + b1) @ w2.T
    if tp_axis:  # row-parallel partial sums: Megatron's reduce-from-tensor-parallel-region
        y = jax.lax.psum(y, tp_axis)
    return x + y + b2


class MLPModel:
    """What the engine needs of a model: weights, a spec per weight, forward, batches, analytic costs."""

    def init(self, plan: Plan) -> dict:
        return init_plan_mlp(plan)

    def spec(self, plan: Plan, name: str):
        return SPECS[plan.strategy][name.split(".")[1]]

    def batch(self, plan: Plan, t: int):
        return make_batch(plan.batch_size, plan.mlp.dim, plan.seed, t)

    def forward(self, plan: Plan, params, x, tp, gather):
        for i in range(plan.mlp.layers):
            keys = [f"{i}.{p}" for p in PARAM_NAMES]

            def f(x, *ws, keys=keys):
                return block(x, *(gather(k, w) for k, w in zip(keys, ws)), tp_axis=tp)

            x = remat(plan, f)(x, *(params[k] for k in keys))
        return x

    def analytic(self, plan: Plan, shapes: dict) -> dict:
        return costs.mlp_costs(plan)

    def torch_reference(self, plan: Plan):
        """The same plan's single-device torch run (cross-backend parity): losses, final params."""
        import torch  # only a cell that compares backends loads torch into the JAX process

        from steps.sharding.reference import DTYPES, mlp_reference

        dtype = DTYPES[plan.dtype]
        full = {k: torch.tensor(v, dtype=dtype) for k, v in self.init(plan).items()}
        losses, _, params = mlp_reference(plan, full, dtype)
        return losses, {k: v.numpy() for k, v in params.items()}
