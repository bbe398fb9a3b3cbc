"""Fully sharded data parallel from scratch (ZeRO-3): each rank keeps 1/N of every block's
parameters as one flat padded shard (so its gradients and Adam moments are 1/N too) and sees 1/N
of the batch. A block's full parameters exist only while it runs:
  forward : all-gather the flat shard, run the block, free the gathered copy
  backward: all-gather again, recompute the block, take its gradients, reduce-scatter them
            (SUM then ÷N: every rank ends with the batch-mean gradient of its own shard)
so a step moves 3Ψ·(N-1)/N bytes per rank, 1.5× DP, for 1/N of the state.
(Real FSDP keeps the block's activations instead of recomputing; the communication is the same.)
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from steps.sharding import comm
from steps.sharding.toy_mlp import PARAM_NAMES, Stack, block, n_blocks


class ShardedBlock(torch.autograd.Function):
    """One block on its flat shard: gather, compute, free; backward gathers again and reduce-scatters."""

    @staticmethod
    def forward(ctx, x, shard, unit):
        ctx.unit = unit
        ctx.save_for_backward(x, shard)
        with torch.no_grad():
            return block(x, *unit.unflatten(unit.gather(shard)))

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        full = unit.gather(shard).requires_grad_()
        with torch.enable_grad():
            xx = x.detach().requires_grad_(ctx.needs_input_grad[0])
            y = block(xx, *unit.unflatten(full))
            inputs = [full, xx] if ctx.needs_input_grad[0] else [full]
            grads = torch.autograd.grad(y, inputs, grad_out)
        g_shard = torch.empty_like(shard)
        comm.reduce_scatter_tensor(g_shard, grads[0].contiguous(), unit.group)
        g_shard.div_(unit.size)
        return (grads[1] if ctx.needs_input_grad[0] else None), g_shard, None


class FSDPUnit(nn.Module):
    """One block: a flat shard of [w1, b1, w2, b2], padded to a multiple of the group size."""

    def __init__(self, full: dict, i: int, group):
        super().__init__()
        self.group, self.size, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        tensors = [full[f"{i}.{p}"] for p in PARAM_NAMES]
        self.shapes = [t.shape for t in tensors]
        self.numel = sum(t.numel() for t in tensors)
        self.chunk = math.ceil(self.numel / self.size)
        flat = torch.zeros(self.chunk * self.size, dtype=tensors[0].dtype)
        flat[: self.numel] = torch.cat([t.reshape(-1) for t in tensors])
        self.shard = self.own(flat)

    def own(self, flat: torch.Tensor) -> nn.Parameter:
        """This rank's slice of the flat block, a copy: the rest is dropped (ZeRO-1/2 keep it: zero1.py)."""
        return nn.Parameter(flat[self.rank * self.chunk : (self.rank + 1) * self.chunk].clone())

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.chunk * self.size, dtype=shard.dtype)
        return comm.all_gather_into_tensor(out, shard.detach(), self.group)

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        parts = flat[: self.numel].split([math.prod(s) for s in self.shapes])
        return [p.view(s) for p, s in zip(parts, self.shapes)]

    def forward(self, x):
        return ShardedBlock.apply(x, self.shard, self)


class FullyShardedMLP(Stack):
    unit = FSDPUnit  # zero1.py/zero2.py: the block kept whole, its optimizer state (and gradient) sharded

    def __init__(self, full: dict[str, torch.Tensor], group=None):
        super().__init__(self.unit(full, i, group) for i in range(n_blocks(full)))

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """Parity check only (plain dist.all_gather_into_tensor, not counted)."""
        out = {}
        for i, u in enumerate(self.blocks):
            local = u.shard if kind == "param" else u.shard.grad
            flat = torch.empty(u.chunk * u.size, dtype=local.dtype)
            dist.all_gather_into_tensor(flat, local.detach().contiguous(), group=u.group)
            out.update({f"{i}.{p}": t.clone() for p, t in zip(PARAM_NAMES, u.unflatten(flat))})
        return out
