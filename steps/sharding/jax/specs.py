"""How the JAX models shard (the AXLearn lesson: the plan is only shardings). Every parameter has
a role of the Megatron MLP: w1/b1 column-parallel weight/bias, w2 row-parallel weight, b2
replicated (row-parallel bias, norms); SPECS gives each role's PartitionSpec per strategy. FSDP
shards every tensor on top of TP."""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from steps.sharding.plan import Plan

SPECS = {
    "single": {"w1": P(), "b1": P(), "w2": P(), "b2": P()},
    "dp": {"w1": P(), "b1": P(), "w2": P(), "b2": P()},
    "fsdp": {"w1": P("fsdp", None), "b1": P("fsdp"), "w2": P("fsdp", None), "b2": P("fsdp")},
    "tp": {"w1": P("tp", None), "b1": P("tp"), "w2": P(None, "tp"), "b2": P()},
    "fsdp_tp": {"w1": P("tp", "fsdp"), "b1": P(("tp", "fsdp")), "w2": P("fsdp", "tp"), "b2": P("fsdp")},
}
SPECS["dp_tp"] = SPECS["tp"]
SPECS["dp_fsdp_tp"] = SPECS["fsdp_tp"]  # HSDP × TP: replicated over dp


def remat(plan: Plan, f):
    """Under FSDP free gathered weights after use, so backward gathers them again (3Ψ)."""
    return jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable) if "fsdp" in plan.mesh else f
