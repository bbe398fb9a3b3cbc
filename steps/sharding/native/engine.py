"""The native torch engines behind the RankEngine interface (engines.py): NativeEngine runs
parallelize_gpt (DDP, FSDP2, TP, dp×tp, fsdp×tp), PipelineEngine runs pipeline_gpt. Both start
from the single-device GPT (gpt.full_model: same seed, same weights on every rank) and count the
collectives that reach the dispatcher (comm.NativeCommMode)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh

from steps.analytic import costs
from steps.models.gpt import GPTLMHeadModel
from steps.sharding import comm
from steps.sharding.gpt_init import full_model, gpt_batch, gpt_config, param_shapes
from steps.sharding.native.parallelize import gpt_mesh_shape, parallelize_gpt, shards_parameters
from steps.sharding.native.pipeline import pipeline_gpt, run_schedule
from steps.sharding.plan import Plan
from steps.sharding.reference import gpt_reference


def _device_type() -> str:
    return torch.get_default_device().type  # the worker sets cuda under NCCL


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


class GPTEngine:
    """What both native engines share: batches, reference, analytic costs, comm counting."""

    stage_params = None  # parameters of this rank's pipeline stage (PP only)

    def __init__(self, plan: Plan, dtype):
        self.plan, self.dtype = plan, dtype
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.data_rank, self.data_size = 0, 1

    def split_batch_over(self, mesh) -> None:
        """This rank's place among the ranks that see different rows: row-major over the plan's data
        axes (dp, then fsdp under HSDP; fsdp, then ep under fsdp_ep)."""
        for axis in self.plan.data_axes:
            self.data_rank = self.data_rank * self.plan.axis(axis) + mesh.get_local_rank(axis)
        self.data_size = self.plan.data_size

    def batch(self, step: int, dtype):
        ids = gpt_batch(self.plan, step)
        return ids.chunk(self.data_size)[self.data_rank]

    def reference(self, dtype=None):
        """The single-device run; `dtype` (float64 for an fp32 cell's tolerances) from the same weights
        (full_model casts the fp32 initialisation)."""
        return gpt_reference(self.plan, dtype or self.dtype)

    def analytic(self) -> dict:
        return costs.gpt_costs(self.plan, self.shapes, self.stage_params)

    def comm_mode(self, counter, world: int):
        return comm.NativeCommMode(counter, world)


class NativeEngine(GPTEngine):
    def __init__(self, plan: Plan, dtype):
        super().__init__(plan, dtype)
        shape = gpt_mesh_shape(plan)
        self.mesh = init_device_mesh(_device_type(), tuple(shape.values()), mesh_dim_names=tuple(shape))
        self.split_batch_over(self.mesh)
        ref = full_model(plan, dtype)
        self.shapes = param_shapes(ref)
        if not shards_parameters(self.mesh):
            self.model = parallelize_gpt(ref, self.mesh, plan)
            return
        # FSDP2: built on the meta device, no rank ever holds the full model except rank 0's
        # state dict, from which the shards are materialised (to_empty + broadcast_from_rank0)
        full_sd = ref.state_dict() if self.rank == 0 else {}
        with torch.device("meta"):
            model = GPTLMHeadModel(gpt_config(plan)).to(dtype)
        self.model = parallelize_gpt(model, self.mesh, plan)
        self.model.to_empty(device=_device_type())
        set_model_state_dict(
            self.model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        )

    def train_step(self, ids) -> torch.Tensor:
        loss = self.model(ids, labels=ids).loss
        loss.backward()
        return full_tensor(loss)

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        model = self.model.module if hasattr(self.model, "module") else self.model  # DDP wraps
        return {k: full_tensor(p if kind == "param" else p.grad) for k, p in model.named_parameters()}


class PipelineEngine(GPTEngine):
    def __init__(self, plan: Plan, dtype):
        super().__init__(plan, dtype)
        self.ref_model = full_model(plan, dtype)
        self.shapes = param_shapes(self.ref_model)
        self.model, self.schedule = pipeline_gpt(self.ref_model, plan, self.rank, self.world)
        mine = {id(p) for p in self.model.parameters()}
        self.stage_names = [k for k, p in self.ref_model.named_parameters() if id(p) in mine]
        self.stage_params = sum(p.numel() for p in self.model.parameters())

    def train_step(self, ids) -> torch.Tensor:
        loss = run_schedule(self.schedule, self.rank, self.world, ids, next(self.model.parameters()).dtype)
        dist.broadcast(loss, src=self.world - 1)  # reporting only
        return loss

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """Every stage's tensors, gathered on the CPU (comm.gather_state)."""
        mine = dict(self.ref_model.named_parameters())
        return comm.gather_state(
            {k: full_tensor(mine[k] if kind == "param" else mine[k].grad) for k in self.stage_names}
        )
