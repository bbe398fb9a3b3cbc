"""Expert parallelism with torch's own pieces, as torchtitan's MoE does (torchtitan/distributed/
expert_parallel.py): the experts' (E, ...) weights become DTensors sharded Shard(0) over the ep mesh
(`distribute_module`), the dispatch and combine are `all_to_all_single_autograd` (the functional
collective whose backward is the swapped all-to-all), the row counts go through the functional
`all_to_all_single`, the load-balancing statistics through torch.distributed.nn's differentiable
all-reduce. The schedule is steps/parallel/ep.py's, shared with scratch.

  ep       mesh {ep: N}: dense parameters under DistributedDataParallel over the ep group, told
           to ignore the experts (each lives on one rank; its gradient is divided by N after backward)
  fsdp_ep  mesh {fsdp: F, ep: N} (torchtitan's dp_shard = F·N with EP inside it): every rank has its
           own rows; dense parameters FSDP2-sharded over all F·N ranks (the flattened mesh); each
           layer's E/N experts FSDP2-sharded again over fsdp, their reduce-scatter divided by F·N
           (set_gradient_divide_factor, torchtitan's fix for the same sum); tokens are dispatched
           within the ep group (the N ranks sharing an fsdp index)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from steps.models.moe import Experts, grouped_mlp
from steps.parallel.ep import Collectives, ExpertParallelMoE, is_expert, moe_layers
from steps.parallel.gpt import full_model, param_shapes
from steps.parallel.native.engine import GPTEngine, _device_type, full_tensor
from steps.parallel.native.parallelize import apply_fsdp
from steps.parallel.plan import Plan


def native_collectives(ep_mesh, pool_group=None) -> Collectives:
    group = ep_mesh.get_group()
    return Collectives(
        all_to_all=lambda x, out_splits, in_splits: all_to_all_single_autograd(
            x.contiguous(), out_splits, in_splits, group
        ),
        exchange_counts=lambda counts: all_to_all_single(counts, None, None, group),
        all_reduce_sum=lambda t: dist_nn.all_reduce(t, group=pool_group or group),
        size=ep_mesh.size(),
        pool=dist.get_world_size(pool_group or group),
    )


class LocalExperts(Experts):
    """Experts whose weights are DTensors: forward runs this rank's shard (to_local)."""

    def forward(self, x, counts: list[int]):
        gate = self.c_fc2.to_local() if self.c_fc2 is not None else None
        return grouped_mlp(x, counts, self.c_fc.to_local(), gate, self.c_proj.to_local(), self.act)


def _shard_dim0(name, module, mesh):
    for pname, p in list(module.named_parameters(recurse=False)):
        module.register_parameter(pname, nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))


def apply_ep(model, ep_mesh, pool_group=None) -> None:
    """In place: every MoE's experts Shard(0) over ep_mesh, its dispatch across the mesh, its
    load-balancing statistics pooled over pool_group (default: the ep group)."""
    collectives = native_collectives(ep_mesh, pool_group)
    for moe in moe_layers(model):
        distribute_module(moe.experts, ep_mesh, _shard_dim0)
        moe.experts.__class__ = LocalExperts
        moe.__class__ = ExpertParallelMoE
        moe.ep, moe.local = collectives, moe.experts


class NativeEPEngine(GPTEngine):
    """strategies ep and fsdp_ep, backend torch_native."""

    def __init__(self, plan: Plan, dtype):
        super().__init__(plan, dtype)
        self.mesh = init_device_mesh(_device_type(), tuple(plan.mesh.values()), mesh_dim_names=tuple(plan.mesh))
        self.split_batch_over(self.mesh)  # every rank its own rows
        model = full_model(plan, dtype)
        self.shapes = param_shapes(model)
        apply_ep(model, self.mesh["ep"], pool_group=dist.group.WORLD)
        if "fsdp" in plan.mesh:
            for moe in moe_layers(model):
                fully_shard(moe.experts, mesh=self.mesh["fsdp"])
                moe.experts.set_gradient_divide_factor(float(self.world))
                # a custom factor makes fp32/bf16 reduce-scatters PREMUL_SUM, which gloo lacks: divide
                # before and after a plain SUM instead (what FSDP2 does for other dtypes)
                moe.experts.set_force_sum_reduction_for_comms(dist.get_backend() == "gloo")
            apply_fsdp(model, self.mesh["fsdp", "ep"]._flatten("dp_shard"))
            self.model, self.divide_experts = model, 1
            return
        experts = [name for name, _ in model.named_parameters() if is_expert(name)]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, experts)
        self.model, self.divide_experts = (
            DistributedDataParallel(model, process_group=self.mesh.get_group()),
            self.world,
        )

    @property
    def module(self):
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    def train_step(self, ids) -> torch.Tensor:
        loss = self.model(ids, labels=ids).loss
        loss.backward()
        if self.divide_experts > 1:  # DDP averaged the dense gradients; the experts' arrived summed
            with torch.no_grad():
                for name, p in self.module.named_parameters():
                    if is_expert(name):
                        p.grad.div_(self.divide_experts)
        return full_tensor(loss)

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        return {k: full_tensor(p if kind == "param" else p.grad) for k, p in self.module.named_parameters()}
