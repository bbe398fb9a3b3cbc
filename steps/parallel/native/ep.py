"""Expert parallelism with torch's own pieces, as torchtitan's MoE does (torchtitan/distributed/
expert_parallel.py): the experts' (E, ...) weights become DTensors sharded Shard(0) over the ep mesh
(`distribute_module`), the dispatch and combine are `all_to_all_single_autograd` (the functional
collective whose backward is the swapped all-to-all), the row counts go through the functional
`all_to_all_single`, the load-balancing statistics through torch.distributed.nn's differentiable
all-reduce. Dense parameters: DistributedDataParallel over the ep group, told to ignore the experts
(each expert lives on one rank; its gradient is divided by N after backward, as torchtitan sets
FSDP's gradient divide factor on them). The schedule is steps/parallel/ep.py's, shared with scratch.
"""

from __future__ import annotations

import torch
import torch.distributed.nn.functional as dist_nn
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from steps.models.moe import grouped_mlp
from steps.parallel.ep import Collectives, ExpertParallelMoE, is_expert, moe_layers
from steps.parallel.gpt import full_model, param_shapes
from steps.parallel.native.engine import GPTEngine, _device_type, full_tensor
from steps.parallel.plan import Plan


def native_collectives(mesh) -> Collectives:
    group = mesh.get_group()
    return Collectives(
        all_to_all=lambda x, out_splits, in_splits: all_to_all_single_autograd(
            x.contiguous(), out_splits, in_splits, group
        ),
        exchange_counts=lambda counts: all_to_all_single(counts, None, None, group),
        all_reduce_sum=lambda t: dist_nn.all_reduce(t, group=group),
        size=mesh.size(),
    )


def _shard_dim0(name, module, mesh):
    for pname, p in list(module.named_parameters(recurse=False)):
        module.register_parameter(pname, nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))


def local_grouped_mlp(experts):
    """(x, counts) -> y through this rank's shard of the experts' DTensor weights."""

    def run(x, counts):
        gate = experts.c_fc2.to_local() if experts.c_fc2 is not None else None
        return grouped_mlp(x, counts, experts.c_fc.to_local(), gate, experts.c_proj.to_local(), experts.act)

    return run


def apply_ep(model, ep_mesh) -> None:
    """In place: every MoE's experts Shard(0) over ep_mesh, its dispatch across the mesh."""
    collectives = native_collectives(ep_mesh)
    for moe in moe_layers(model):
        distribute_module(moe.experts, ep_mesh, _shard_dim0)
        moe.__class__ = ExpertParallelMoE
        moe.ep, moe.local = collectives, local_grouped_mlp(moe.experts)


class NativeEPEngine(GPTEngine):
    """strategy ep, backend torch_native."""

    def __init__(self, plan: Plan, dtype):
        super().__init__(plan, dtype)
        self.mesh = init_device_mesh(_device_type(), (plan.axis("ep"),), mesh_dim_names=("ep",))
        self.data_rank, self.data_size = self.mesh.get_local_rank("ep"), plan.axis("ep")
        model = full_model(plan, dtype)
        self.shapes = param_shapes(model)
        apply_ep(model, self.mesh)
        experts = [name for name, _ in model.named_parameters() if is_expert(name)]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, experts)
        self.model = DistributedDataParallel(model, process_group=self.mesh.get_group())

    def train_step(self, ids) -> torch.Tensor:
        loss = self.model(ids, labels=ids).loss
        loss.backward()
        with torch.no_grad():
            for name, p in self.model.module.named_parameters():
                if is_expert(name):
                    p.grad.div_(self.data_size)
        return loss.detach()

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        return {k: full_tensor(p if kind == "param" else p.grad) for k, p in self.model.module.named_parameters()}
