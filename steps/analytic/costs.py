"""What a sharding engine's analytic() returns for its plan: per-rank state bytes, per-rank
communication bytes per step and the parameter count. Measured numbers are divided by these; a
ratio of 1 means the implementation moves and keeps exactly what the theory says.

state = params + grads + optimizer moments = plan.state_tensors × the local parameter count × the
bytes per element (4 tensors with Adam, 3 with SGD-momentum; the cells train in one dtype).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steps.analytic.comm import gpt_comm, mlp_comm
from steps.analytic.params import gpt_local_params, mlp_local_params, mlp_psi

if TYPE_CHECKING:  # annotations only: this package imports neither torch nor the plans
    from steps.parallel.plan import Plan


def mlp_costs(plan: Plan) -> dict:
    """The engines' analytic(): state bytes, comm bytes, parameter count of the MLP."""
    return {
        "state_bytes": plan.state_tensors * mlp_local_params(plan) * plan.bytes_per_elem,
        "comm_bytes": mlp_comm(plan),
        "params": mlp_psi(plan),
    }


def gpt_costs(plan: Plan, shapes: dict[str, int], stage_params: float | None = None) -> dict:
    """The engines' analytic() for the GPT (or its blocks): state bytes, comm bytes, parameters."""
    return {
        "state_bytes": plan.state_tensors * gpt_local_params(plan, shapes, stage_params) * plan.bytes_per_elem,
        "comm_bytes": gpt_comm(plan, shapes),
        "params": sum(shapes.values()),
    }
