"""The from-scratch engine: one of dp/tp/fsdp/pp/zero1/zero2 (or dp×tp: DataParallel over TP shards) built
from the plan, behind the RankEngine interface the rank loop drives (engines.py).

BUILDERS maps each strategy to a function returning (the sharded MLP, this rank's index on the
data axis, that axis' size); the engine registry lists these strategies for torch_scratch.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from steps.analytic import costs
from steps.sharding.plan import Plan, PlanError
from steps.sharding.reference import mlp_reference
from steps.sharding.scratch.dp import DataParallel
from steps.sharding.scratch.ep import ScratchGPTEngine
from steps.sharding.scratch.fsdp import FullyShardedMLP
from steps.sharding.scratch.pp import PipelineMLP
from steps.sharding.scratch.tp import TensorParallelMLP
from steps.sharding.scratch.zero1 import ZeRO1MLP
from steps.sharding.scratch.zero2 import ZeRO2MLP
from steps.sharding.toy_mlp import MLP
from steps.sharding.toy_mlp_init import init_plan_mlp, make_batch


def _whole_world() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def build_dp(plan: Plan, full: dict):
    return DataParallel(MLP(full)), *_whole_world()


def build_fsdp(plan: Plan, full: dict):
    return FullyShardedMLP(full), *_whole_world()


def build_tp(plan: Plan, full: dict):
    return TensorParallelMLP(full), 0, 1


def build_pp(plan: Plan, full: dict):
    return PipelineMLP(full, plan.schedule, plan.microbatches), 0, 1


def build_dp_tp(plan: Plan, full: dict):
    mesh = init_device_mesh(torch.get_default_device().type, tuple(plan.mesh.values()), mesh_dim_names=tuple(plan.mesh))
    model = DataParallel(TensorParallelMLP(full, mesh.get_group("tp")), mesh.get_group("dp"))
    return model, mesh.get_local_rank("dp"), plan.axis("dp")


def build_zero1(plan: Plan, full: dict):
    return ZeRO1MLP(full), *_whole_world()


def build_zero2(plan: Plan, full: dict):
    return ZeRO2MLP(full), *_whole_world()


BUILDERS = {
    "dp": build_dp,
    "fsdp": build_fsdp,
    "tp": build_tp,
    "pp": build_pp,
    "dp_tp": build_dp_tp,
    "zero1": build_zero1,
    "zero2": build_zero2,
}


class ScratchEngine:
    """The MLP from numpy weights (toy_mlp_init.py), sharded by the plan's strategy. A dp plan on the
    GPT (model: gpt, e.g. the MoE GPT) gets ep.py's ScratchGPTEngine instead: the registry keys on
    backend and strategy, the model picks between the two here."""

    def __new__(cls, plan: Plan, dtype):
        if cls is ScratchEngine and plan.model == "gpt":
            if plan.strategy != "dp":
                raise PlanError(
                    f"sharding: backend torch_scratch runs model gpt under dp and ep only, not {plan.strategy} "
                    "(its fsdp/tp/pp/dp_tp shard the MLP); fix: model: mlp, or backend: torch_native"
                )
            return ScratchGPTEngine(plan, dtype)
        return super().__new__(cls)

    def __init__(self, plan: Plan, dtype):
        self.plan, self.dtype = plan, dtype
        self.full = {k: torch.tensor(v, dtype=dtype) for k, v in init_plan_mlp(plan).items()}
        self.model, self.data_rank, self.data_size = BUILDERS[plan.strategy](plan, self.full)

    def batch(self, step: int, dtype):
        x, y = (
            torch.tensor(a, dtype=dtype)
            for a in make_batch(self.plan.batch_size, self.plan.mlp.dim, self.plan.seed, step)
        )
        return tuple(t.chunk(self.data_size)[self.data_rank] for t in (x, y))

    def train_step(self, batch) -> torch.Tensor:
        return self.model.train_step(*batch)

    def full_state(self, kind: str) -> dict[str, torch.Tensor]:
        return self.model.full_state(kind)

    def reference(self, dtype=None):
        """The single-device run; `dtype` (float64 for an fp32 cell's tolerances) from the same weights."""
        dtype = dtype or self.dtype
        return mlp_reference(self.plan, {k: v.to(dtype) for k, v in self.full.items()}, dtype)

    def analytic(self) -> dict:
        return costs.mlp_costs(self.plan)

    def comm_mode(self, counter, world: int):
        """Nothing to add: every collective goes through comm.py's counted wrappers."""
        return nullcontext()
