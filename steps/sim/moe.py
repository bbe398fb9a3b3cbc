"""The MoE GPT on the fake process group: balanced routing, and expert parallelism as the
sharding stage's native cells run it (steps/parallel/native/ep.py: the experts Shard(0) over the
ep axis, FSDP2 over fsdp; the dense parameters FSDP2 over fsdp × ep, torchtitan's dp_shard).

Fake tensors carry no values, so nothing can be counted from them: every expert is given the same
N·k/E rows of this rank's N tokens (balanced routing — the convention the analytic all-to-all bytes
use, steps/parallel/comm.all_to_all_single), and every rank sends each expert's owner those rows.
The row-count exchange still runs (its bytes are charged), its values are the balanced ones.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

from steps.models.moe import MoE
from steps.parallel.ep import ExpertParallelMoE, moe_layers
from steps.parallel.native.ep import apply_ep


class BalancedMoE(MoE):
    def expert_counts(self, choice) -> list[int]:
        per, left = divmod(choice.numel(), self.n_experts)
        if left:
            raise ValueError(f"balanced routing needs tokens·top_k ({choice.numel()}) divisible by experts")
        return [per] * self.n_experts


class BalancedEPMoE(BalancedMoE, ExpertParallelMoE):
    def received_counts(self, send):
        self.ep.exchange_counts(send)  # the exchange's bytes; its (fake) values are not read
        return [[self.rows_per_expert] * (self.n_experts // self.ep.size)] * self.ep.size

    def expert_counts(self, choice) -> list[int]:
        counts = super().expert_counts(choice)
        self.rows_per_expert = counts[0]
        return counts


def balance(model) -> None:
    for moe in moe_layers(model):
        moe.__class__ = BalancedEPMoE if isinstance(moe, ExpertParallelMoE) else BalancedMoE


def apply_expert_parallel(model, ep_mesh, fsdp_mesh, data_group, mp_policy) -> None:
    """EP over ep_mesh (load-balancing statistics pooled over data_group), then each layer's local
    experts FSDP2 over fsdp_mesh (a mesh of one is fine), their reduce-scatter divided by every data
    rank (the dense gradients' FSDP2 average over fsdp × ep; native/ep.py, torchtitan)."""
    apply_ep(model, ep_mesh, pool_group=data_group)
    balance(model)
    world = torch.distributed.get_world_size(data_group)
    for moe in moe_layers(model):
        # fewer local experts than fsdp ranks (Mixtral, ep 8: one): shard each expert's rows instead of
        # padding dim 0 to the fsdp size, which would leave every rank a whole expert (torchtitan does the same)
        few = moe.n_experts // ep_mesh.size() < fsdp_mesh.size()
        place = (lambda p: Shard(1)) if few else None
        fully_shard(moe.experts, mesh=fsdp_mesh, mp_policy=mp_policy, shard_placement_fn=place)
        moe.experts.set_gradient_divide_factor(float(world))
