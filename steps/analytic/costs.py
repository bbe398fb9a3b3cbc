"""What a sharding engine's analytic() returns for its plan: per-rank state bytes, per-rank
communication bytes per step and the parameter count. Measured numbers are divided by these; a
ratio of 1 means the implementation moves and keeps exactly what the theory says.

state = params + grads + optimizer moments = plan.state_tensors × the local parameter count × the
bytes per element (4 tensors with Adam, 3 with SGD-momentum; the cells train in one dtype).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steps.analytic.comm import gpt_comm, mlp_comm, ring_all_reduce, ring_bytes
from steps.analytic.params import gpt_local_params, gpt_stage_shapes, mlp_local_params, mlp_psi

if TYPE_CHECKING:  # annotations only: this package imports neither torch nor the plans
    from steps.sharding.plan import Plan


def mlp_costs(plan: Plan) -> dict:
    """The engines' analytic(): state bytes (and its parts), comm bytes, parameter count of the MLP."""
    parts = state_parts(plan, mlp_local_params(plan))
    return {
        "state_bytes": sum(parts.values()),
        "state_parts": parts,
        "comm_bytes": mlp_comm(plan),
        "params": mlp_psi(plan),
    }


def state_parts(plan: Plan, local: float) -> dict:
    """Per-rank bytes of params, grads and optimizer moments for `local` parameters on the rank (after
    TP, PP and FSDP = ZeRO-3). ZeRO-1 (strategy zero1) divides the moments by the dp ranks, ZeRO-2
    (zero2) the gradients too; the replicas keep every parameter. Their comm is DP's: a reduce-scatter
    and an all-gather (2Ψ) are one all-reduce's bytes (comm.mlp_comm)."""
    b, n = plan.bytes_per_elem, plan.axis("dp")
    stage = {"zero1": 1, "zero2": 2}.get(plan.strategy, 0)
    return {
        "params": local * b,
        "grads": local * b / (n if stage >= 2 else 1),
        "optim": (plan.state_tensors - 2) * local * b / (n if stage >= 1 else 1),
    }


def gpt_costs(plan: Plan, shapes: dict[str, int], stage_params: float | None = None) -> dict:
    """The engines' analytic() for the GPT (or its blocks): state bytes, comm bytes, parameters."""
    return {
        "state_bytes": plan.state_tensors * gpt_local_params(plan, shapes, stage_params) * plan.bytes_per_elem,
        "comm_bytes": gpt_comm(plan, shapes),
        "params": sum(shapes.values()),
    }


def gpt_pipeline_costs(plan: Plan, shapes: dict[str, int], stage: int) -> dict:
    """PP combined with dp, tp or fsdp (native/pp_mesh.py): the rank's state is its stage's
    parameters (gpt_stage_shapes) after TP and FSDP; its comm the stages' mean (the cell's
    dispatched bytes are the ranks' mean), each stage's own DP/FSDP/TP bytes plus the pipeline's."""
    stages = [gpt_stage_shapes(plan, shapes, s) for s in range(plan.axis("pp"))]
    local = gpt_local_params(plan, stages[stage])
    return {
        "state_bytes": plan.state_tensors * local * plan.bytes_per_elem,
        "comm_bytes": sum(gpt_comm(plan, st) for st in stages) / len(stages),
        "params": sum(shapes.values()),
    }


def gshard_moe_costs(plan: Plan, router: int, experts: int) -> dict:
    """The JAX MoE blocks' analytic() (steps/sharding/jax/moe_blocks.py: GShard's dense dispatch), `router` and
    `experts` their parameter counts. State: router + E/N experts per device. Comm per step: four
    all-to-alls of the (E, cap, C) buffer per layer (cap = the device's B·T/N tokens) less one: the
    first layer's dispatch needs no transpose (the input needs no gradient and the routing one-hots
    carry none, so XLA drops it, as scratch TP skips its first copy-to); the router's gradient
    all-reduce and the loss's pmean (one number; XLA fuses the two into one all-reduce)."""
    g, b, n = plan.gpt, plan.bytes_per_elem, plan.axis("ep")
    cap = plan.batch_size // n * g["block_size"]
    comm = 0.0
    if n > 1:
        buf = g["moe"]["experts"] * cap * g["n_embd"] * b
        comm = (4 * g["n_layer"] - 1) * ring_bytes("all_to_all", buf, n)
        comm += ring_all_reduce(router * b, n) + ring_all_reduce(b, n)
    return {
        "state_bytes": plan.state_tensors * (router + experts / n) * b,
        "comm_bytes": comm,
        "params": router + experts,
    }
