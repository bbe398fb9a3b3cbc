"""ZeRO-2 from scratch (optimizer-state and gradient sharding, ZeRO's P_os+g): ZeRO-1 (zero1.py) whose
gradient is sharded too. As soon as a block's gradient is complete in backward (a post-accumulate-grad
hook on its replica) it is reduce-scattered (SUM, ÷N) and the whole gradient freed, so a rank keeps
the gradient of its own slice only (while backward runs: at most one block's whole gradient more).
The same 2Ψ·(N-1)/N per step as ZeRO-1 and DP, for state Ψ + Ψ/N + 2Ψ/N; fsdp.py (ZeRO-3) also
shards the parameters.
"""

from __future__ import annotations

import torch

from steps.sharding.scratch.zero1 import ZeRO1MLP, ZeROBlock


class ZeRO2Block(ZeROBlock):
    def __init__(self, full: dict, i: int, group):
        super().__init__(full, i, group)
        self.replica.register_post_accumulate_grad_hook(self.reduce_and_free)

    def reduce_and_free(self, replica: torch.Tensor) -> None:
        """In backward, as this block's gradient completes: keep its reduced slice, free the rest."""
        self.shard.grad = self.reduce_scatter(replica.grad)
        replica.grad = None

    def after_backward(self) -> None:
        """Done in backward (reduce_and_free)."""

    def grads_held(self) -> list:
        return [self.shard.grad]


class ZeRO2MLP(ZeRO1MLP):
    unit = ZeRO2Block
