"""Data parallel from scratch: every rank holds the whole model and sees 1/N of the batch;
after backward one SUM all-reduce per gradient, divided by N, makes every replica's gradient
the full-batch gradient (DDP's bucketing/overlap left out so the cost stays visible: 2Ψ·(N-1)/N).

`DataParallel` wraps any Stack (the plain MLP, or the TP-sharded MLP for dp×tp): the group is
whichever axis of the mesh replicates it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from steps.sharding import comm
from steps.sharding.toy_mlp import loss_fn


class DataParallel(nn.Module):
    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        self.module, self.group = module, group
        self.size = dist.get_world_size(group)

    def forward(self, x):
        return self.module(x)

    @torch.no_grad()
    def sync_grads(self) -> None:
        """Called after backward: grad <- mean over the replicas."""
        for p in self.module.parameters():
            comm.all_reduce(p.grad, group=self.group)
            p.grad.div_(self.size)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(self(x), y)
        loss.backward()
        self.sync_grads()
        return loss.detach()

    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """Replicas agree, so the inner module's own view is already the full state."""
        return self.module.full_state(kind)
