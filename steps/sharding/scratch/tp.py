"""Tensor parallel from scratch (Megatron-LM MLP): W1 column-parallel, W2 row-parallel.

Each rank holds hidden/T rows of W1 (and of b1) and hidden/T columns of W2, so the hidden
activation never leaves the rank. Two conjugate operators (Megatron's names) glue the ranks:
  copy_to_tensor_parallel_region      identity forward, all-reduce of the input gradient backward
                                      (before the column-parallel linear; Megatron's f)
  reduce_from_tensor_parallel_region  all-reduce of the partial outputs forward, identity backward
                                      (after the row-parallel linear; Megatron's g)
Per block and step: one all-reduce of (batch, dim) forward and one backward — the first block's
copy-to backward is skipped because the input needs no gradient, hence (2L-1) all-reduces per step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from steps.sharding import comm
from steps.sharding.toy_mlp import PARAM_NAMES, Stack, n_blocks


class CopyToTensorParallelRegion(torch.autograd.Function):
    """Identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.contiguous().clone(), ctx.group), None


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """All-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return comm.all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tensor_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    return CopyToTensorParallelRegion.apply(x, group)


def reduce_from_tensor_parallel_region(x: torch.Tensor, group) -> torch.Tensor:
    return ReduceFromTensorParallelRegion.apply(x, group)


# (dim of the full tensor split across ranks, or None = replicated) per parameter
SPLIT = {"w1": 0, "b1": 0, "w2": 1, "b2": None}


def shard(t: torch.Tensor, dim: int | None, rank: int, size: int) -> torch.Tensor:
    return t.clone() if dim is None else t.chunk(size, dim=dim)[rank].clone()


class TPBlock(nn.Module):
    def __init__(self, full: dict, i: int, group):
        super().__init__()
        self.group = group
        r, n = dist.get_rank(group), dist.get_world_size(group)
        for p in PARAM_NAMES:
            setattr(self, p, nn.Parameter(shard(full[f"{i}.{p}"], SPLIT[p], r, n)))

    def forward(self, x):
        h = F.relu(F.linear(copy_to_tensor_parallel_region(x, self.group), self.w1, self.b1))  # column-parallel
        return x + reduce_from_tensor_parallel_region(F.linear(h, self.w2), self.group) + self.b2  # row, bias once


class TensorParallelMLP(Stack):
    def __init__(self, full: dict[str, torch.Tensor], group=None):
        super().__init__(TPBlock(full, i, group) for i in range(n_blocks(full)))
        self.group = group

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """Reassemble the shards (parity check only: plain dist.all_gather, not counted)."""
        n = dist.get_world_size(self.group)
        out = {}
        for i, b in enumerate(self.blocks):
            for p in PARAM_NAMES:
                t = getattr(b, p)
                t = (t if kind == "param" else t.grad).detach().contiguous()
                if SPLIT[p] is None:
                    out[f"{i}.{p}"] = t
                    continue
                parts = [torch.empty_like(t) for _ in range(n)]
                dist.all_gather(parts, t, group=self.group)
                out[f"{i}.{p}"] = torch.cat(parts, dim=SPLIT[p])
        return out
