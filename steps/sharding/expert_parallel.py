"""Expert parallelism on the MoE GPT (steps/models/moe.py), shared by the scratch and native engines.

The ep axis is a data axis for everything but the experts: each of its N ranks sees 1/N of the
batch and holds every dense parameter (their gradients are averaged over the axis, as DP does),
but only E/N experts — rank r owns experts r·E/N .. (r+1)·E/N - 1 (contiguous, torchtitan's
Shard(0)). Per MoE layer and step (GShard, Lepikhin et al. 2020; torchtitan's ExpertParallel):

  1. route locally, group this rank's N_r·k assignments by expert (moe.MoE.forward, unchanged)
  2. exchange the per-expert row counts (an all-to-all of E integers): who sends me how many rows
  3. dispatch: all-to-all the rows to their experts' ranks (uneven splits)
  4. regroup the received rows (by source rank, then expert) by local expert; run the local experts
  5. combine: the reverse all-to-all brings every row back to its token's rank, in the order it left
Backward: the gradient of an all-to-all is the all-to-all with the splits swapped (steps 5, then 3).
The load-balancing loss pools its statistics over the data ranks (an all-reduce of 2E numbers
forward and of their gradient backward: router_stats.py), so every rank's aux loss is the global
batch's, as on one device.

An expert's gradient arrives whole on its owner (every token routed to it came through the
dispatch), summed over the ranks' per-rank mean losses: divided by N it is the one-device gradient,
as the dense parameters' averaged all-reduce is (torchtitan: FSDP's gradient divide factor on the
experts). `collectives` are the engine's: hand-written autograd (scratch) or torch's (native).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from steps.models.moe import MoE
from steps.sharding.router_stats import PooledStatsMoE, moe_layers, pool_router_stats


@dataclass
class Collectives:
    """The three collectives EP needs, as (differentiable) functions over the ep group."""

    all_to_all: Callable  # (x (M, C), out_splits, in_splits) -> (sum(out_splits), C), autograd-aware
    exchange_counts: Callable  # (counts (E,) int64) -> (E,): [source rank, local expert] row counts
    all_reduce_sum: Callable  # (t,) -> sum over the pooled ranks, backward: sum of their gradients
    size: int  # ranks of the ep group
    pool: int  # ranks whose batches the load-balancing statistics pool: every data rank (ep, or fsdp × ep)


class ExpertParallelMoE(PooledStatsMoE):
    """MoE whose run_experts crosses the ep group and whose statistics pool over the data ranks.
    Built by expert_parallel_moe: swaps the class of a MoE (same router and dropout) and sets `ep`
    (Collectives) and `local` ((x, counts) -> y: the E/N local experts' grouped MLP; a module, so
    that FSDP's hooks around it run)."""

    ep: Collectives
    local: Callable

    def run_experts(self, rows, counts: list[int]):
        n = self.ep.size
        e_loc = self.n_experts // n
        send = torch.tensor(counts, dtype=torch.int64, device=rows.device)  # (E,) rows per global expert
        recv = self.received_counts(send)  # [N][E/N] rows from each source per local expert
        send_splits = [sum(counts[r * e_loc : (r + 1) * e_loc]) for r in range(n)]
        recv_splits = [sum(row) for row in recv]
        x = self.ep.all_to_all(rows, recv_splits, send_splits)  # (M_in, C) by source, then local expert
        repeats = torch.tensor([c for row in recv for c in row], device=rows.device)  # (N·E/N,)
        expert = torch.arange(e_loc, device=rows.device).repeat(n).repeat_interleave(repeats, output_size=len(x))
        perm = torch.argsort(expert, stable=True)  # (M_in,) grouped by local expert
        y = self.local(x[perm], [sum(col) for col in zip(*recv)])  # (M_in, C)
        y = y[torch.argsort(perm)]  # back to (source, expert) order
        return self.ep.all_to_all(y, send_splits, recv_splits)  # (M, C) in the order the rows left

    def received_counts(self, send) -> list[list[int]]:
        """(E,) rows this rank sends per global expert -> [N][E/N] rows it receives per source and local expert."""
        return self.ep.exchange_counts(send).view(self.ep.size, -1).tolist()


def expert_parallel_moe(model, collectives: Collectives, local: Callable[[MoE], Callable]) -> None:
    """In place: every MoE layer of `model` dispatches over `collectives` to `local(moe)` (its local
    experts) and pools its load-balancing statistics over collectives.pool data ranks."""
    pool_router_stats(model, collectives.all_reduce_sum, collectives.pool, cls=ExpertParallelMoE)
    for moe in moe_layers(model):
        moe.ep, moe.local = collectives, local(moe)


def is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def local_experts(n_experts: int, rank: int, size: int) -> slice:
    per = n_experts // size
    return slice(rank * per, (rank + 1) * per)
