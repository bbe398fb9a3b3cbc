"""Expert parallelism from scratch on the MoE GPT (the dispatch and its schedule: steps/sharding/expert_parallel.py),
and data parallelism from scratch on the (MoE) GPT (ScratchGPTEngine: the MLP engines' dp.py step).

The collectives' autograd by hand, as tp.py's Megatron operators:
  AllToAll      forward: rows to ranks by in_splits; backward: the gradient rows back, splits swapped
  AllReduceSum  forward: SUM over the ranks; backward: SUM of the ranks' gradients (every rank's aux
                loss is the same global one, and each rank's backward only reaches its own tokens)
Dense parameters are replicated: after backward, one SUM all-reduce per gradient divided by N
(dp.py's step); the experts' gradients are divided by N (see ep.py). Every collective goes through
comm.py's counted wrappers.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist

from steps.sharding import comm
from steps.sharding.expert_parallel import Collectives, expert_parallel_moe, is_expert, local_experts, moe_layers
from steps.sharding.gpt_init import full_model, param_shapes
from steps.sharding.native.engine import GPTEngine
from steps.sharding.plan import Plan
from steps.sharding.router_stats import pool_router_stats


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty(sum(out_splits), *x.shape[1:])
        return comm.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), *grad.shape[1:])
        return comm.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, ctx.group), None, None, None


class AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return comm.all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.contiguous().clone(), ctx.group), None


def scratch_collectives(group=None) -> Collectives:
    def exchange_counts(counts):
        out = torch.empty_like(counts)
        return comm.all_to_all_single(out, counts, None, None, group)  # E/N counts to each rank

    return Collectives(
        all_to_all=lambda x, out_splits, in_splits: AllToAll.apply(x, out_splits, in_splits, group),
        exchange_counts=exchange_counts,
        all_reduce_sum=lambda t: AllReduceSum.apply(t, group),
        size=dist.get_world_size(group),
        pool=dist.get_world_size(group),
    )


def shard_experts(model, rank: int, size: int, collectives: Collectives) -> None:
    """In place: every MoE keeps its router, holds experts[rank·E/N : (rank+1)·E/N] only, and
    dispatches through `collectives`."""
    for moe in moe_layers(model):
        moe.experts = moe.experts.select(local_experts(moe.n_experts, rank, size))
    expert_parallel_moe(model, collectives, lambda moe: moe.experts)


class ScratchGPTEngine(GPTEngine):
    """backend torch_scratch on the GPT, strategy dp: the whole model on every rank, each rank its own
    rows, every gradient all-reduced and divided by N (dp.py's step), a MoE's load-balancing
    statistics pooled over the ranks by AllReduceSum (router_stats.py). ScratchEPEngine: ep."""

    expert_shards = 1  # ranks the experts are split over

    def __init__(self, plan: Plan, dtype):
        super().__init__(plan, dtype)
        self.data_rank, self.data_size = self.rank, self.world
        self.model = full_model(plan, dtype)
        self.shapes = param_shapes(self.model)
        self.distribute(scratch_collectives())

    def distribute(self, collectives: Collectives) -> None:
        pool_router_stats(self.model, collectives.all_reduce_sum, collectives.pool)

    def sharded(self, name: str) -> bool:
        """Whether this rank holds only its share of parameter `name` (its own experts)."""
        return self.expert_shards > 1 and is_expert(name)

    def train_step(self, ids) -> torch.Tensor:
        loss = self.model(ids, labels=ids).loss
        loss.backward()
        self.sync_grads()
        return loss.detach()

    @torch.no_grad()
    def sync_grads(self) -> None:
        """Replicated: mean over the replicas (an all-reduce each); sharded experts: whole already, / N."""
        for name, p in self.model.named_parameters():
            if not self.sharded(name):
                comm.all_reduce(p.grad)
            p.grad.div_(self.world)

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """Sharded experts gathered over the ranks (parity check only: plain dist.all_gather, not counted)."""
        out = {}
        for name, p in self.model.named_parameters():
            t = (p if kind == "param" else p.grad).detach().contiguous()
            if self.sharded(name):
                parts = [torch.empty_like(t) for _ in range(self.world)]
                dist.all_gather(parts, t)
                t = torch.cat(parts)
            out[name] = t
        return out

    def comm_mode(self, counter, world: int):
        """Nothing to add: every collective goes through comm.py's counted wrappers."""
        return nullcontext()


class ScratchEPEngine(ScratchGPTEngine):
    """strategy ep, backend torch_scratch: the GPT with its experts sharded over every rank."""

    def distribute(self, collectives: Collectives) -> None:
        self.expert_shards = self.world
        shard_experts(self.model, self.rank, self.world, collectives)
