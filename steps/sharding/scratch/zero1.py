"""ZeRO-1 from scratch (optimizer-state sharding, ZeRO's P_os): every rank holds the whole model and,
after backward, its whole gradient, as DP, and sees 1/N of the batch; but each block's parameters
are one flat padded replica of which rank r owns slice r: the optimizer's parameter is that slice (a
view into the replica), so Adam's two moments exist for 1/N of the parameters on each rank.
  forward : all-gather the owners' slices into every replica (the previous step's update: the rank
            loop owns opt.step(), so the gather opens the next step), run the block on the replica
  backward: the block's whole gradient lands in the replica's grad (Ψ, kept, as DDP's buckets); then
            one reduce-scatter per block (SUM, ÷N): rank r's slice of it is its batch-mean gradient
  step    : Adam on the owned slice only
so a step moves 2Ψ·(N-1)/N per rank, as DP (a reduce-scatter and an all-gather are an all-reduce), for
state Ψ + Ψ + 2Ψ/N (params, grads, Adam moments: one dtype here; under mixed precision the fp32
master copy is sharded with the moments). zero2.py also shards the gradient; fsdp.py (ZeRO-3) the
parameters too.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from steps.sharding import comm
from steps.sharding.scratch.fsdp import FSDPUnit, FullyShardedMLP
from steps.sharding.toy_mlp import block


class ZeROBlock(FSDPUnit):
    """FSDPUnit's flat padded block, kept whole on every rank (`replica`); `shard` is this rank's
    slice of it, a view: the optimizer updates the replica's own slice in place."""

    def own(self, flat: torch.Tensor) -> nn.Parameter:
        shard = nn.Parameter(flat[self.rank * self.chunk : (self.rank + 1) * self.chunk])  # a view, no copy
        self.replica = flat.requires_grad_()
        return shard

    @torch.no_grad()
    def refresh(self) -> None:
        """Every owner's slice (as its optimizer left it) into this rank's replica."""
        self.replica.copy_(self.gather(self.shard))

    def forward(self, x):
        self.refresh()
        return block(x, *self.unflatten(self.replica))

    @torch.no_grad()
    def reduce_scatter(self, grad: torch.Tensor) -> torch.Tensor:
        """The batch-mean gradient of this rank's slice: SUM reduce-scatter of the whole gradient, ÷N."""
        out = torch.empty(self.chunk, dtype=grad.dtype)
        return comm.reduce_scatter_tensor(out, grad.contiguous(), self.group).div_(self.size)

    def after_backward(self) -> None:
        """ZeRO-1: reduce the whole gradient once backward is done, keep it; the slice's gradient is
        written into the replica's gradient and is a view of it."""
        mine = self.replica.grad[self.rank * self.chunk : (self.rank + 1) * self.chunk]
        mine.copy_(self.reduce_scatter(self.replica.grad))
        self.shard.grad = mine

    def grads_held(self) -> list:
        return [self.replica.grad]


class ZeRO1MLP(FullyShardedMLP):
    """The MLP as ZeROBlocks; full_state is FSDP's (it gathers the owned slices and their gradients)."""

    unit = ZeROBlock

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            b.replica.grad = None  # the optimizer zeroes its slices' gradients, not the replica's
        loss = super().train_step(x, y)
        for b in self.blocks:
            b.after_backward()
        return loss

    def held(self) -> dict[str, list]:
        """What the rank keeps beside the optimizer's view (worker.state_bytes): every replica, and the
        gradients (zero1: whole; zero2: the owned slices)."""
        return {"params": [b.replica for b in self.blocks], "grads": [g for b in self.blocks for g in b.grads_held()]}
