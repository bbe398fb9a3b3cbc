"""Expert parallelism with torch's own pieces, as torchtitan's MoE does (torchtitan/distributed/
expert_parallel.py): the experts' (E, ...) weights become DTensors sharded Shard(0) over the ep mesh
(`distribute_module`), the dispatch and combine are `all_to_all_single_autograd` (the functional
collective whose backward is the swapped all-to-all), the row counts go through the functional
`all_to_all_single`, the load-balancing statistics through torch.distributed.nn's differentiable
all-reduce (native/parallelize.py: apply_ep). The schedule is steps/sharding/expert_parallel.py's,
shared with scratch.

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
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from steps.sharding.expert_parallel import is_expert
from steps.sharding.gpt_init import full_model, param_shapes
from steps.sharding.native.engine import GPTEngine, _device_type, full_tensor
from steps.sharding.native.parallelize import apply_ddp, apply_ep, apply_fsdp
from steps.sharding.plan import Plan


class NativeEPEngine(GPTEngine):
    """strategies ep and fsdp_ep, backend torch_native."""

    def __init__(self, plan: Plan, dtype):
        super().__init__(plan, dtype)
        self.mesh = init_device_mesh(_device_type(), tuple(plan.mesh.values()), mesh_dim_names=tuple(plan.mesh))
        self.split_batch_over(self.mesh)  # every rank its own rows
        model = full_model(plan, dtype)
        self.shapes = param_shapes(model)
        if "fsdp" in plan.mesh:  # the experts FSDP2 over fsdp, the dense parameters over fsdp × ep
            apply_ep(model, self.mesh["ep"], pool_group=dist.group.WORLD, fsdp_mesh=self.mesh["fsdp"])
            apply_fsdp(model, self.mesh["fsdp", "ep"]._flatten("dp_shard"))
            self.model, self.divide_experts = model, 1
            return
        apply_ep(model, self.mesh["ep"], pool_group=dist.group.WORLD)
        experts = tuple(name for name, _ in model.named_parameters() if is_expert(name))
        self.model, self.divide_experts = apply_ddp(model, self.mesh, ignore=experts), self.world

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
