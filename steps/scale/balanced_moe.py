"""The MoE GPT on the fake process group: balanced routing. Expert parallelism is the sharding
stage's native cells' own (parallelize.apply_ep, fakeworld.parallelized: the experts Shard(0) over
the ep axis, FSDP2 over fsdp; the dense parameters FSDP2 over fsdp × ep, torchtitan's dp_shard).

Fake tensors carry no values, so nothing can be counted from them: every expert is given the same
N·k/E rows of this rank's N tokens (balanced routing — the convention the analytic all-to-all bytes
use, steps/sharding/comm.all_to_all_single), and every rank sends each expert's owner those rows.
The row-count exchange still runs (its bytes are charged), its values are the balanced ones.
"""

from __future__ import annotations

from steps.models.moe import MoE
from steps.sharding.expert_parallel import ExpertParallelMoE, moe_layers


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
