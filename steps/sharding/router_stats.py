"""The MoE's load-balancing statistics over the global batch, under any strategy that splits it.

The load-balancing loss (steps/models/moe.py) is a product of two batch means per expert: the
fraction of top-k selections f_e and the mean router probability P_e, aux = E · sum_e f_e P_e. A
rank that sees 1/N of the batch and forms aux from its own tokens computes E · sum_e f_e^r P_e^r;
the mean of that over the ranks is not E · sum_e f_e P_e (a mean of products is not the product of
the means), so DP/FSDP with a per-shard aux loss misses one device (parameters by 3e-3 after 3 Adam steps in fp64,
where 1e-15 is due: docs/sharding.md). The cross-entropy is unaffected: a mean of per-token terms.

Megatron-LM's global_aux_loss (--moe-router-load-balancing-type global_aux_loss: the tokens per
expert all-reduced over the tensor × data × context-parallel group before the loss is formed; its
default aux_loss stays per micro-batch, a per-shard definition) and torchtitan (tokens per expert
all-reduced over dp_cp for its load-balancing bias update) take the global batch's statistics; so
does this: every data rank all-reduces its selections and probability sums (2E numbers per MoE
layer), and the token count is N times its own, so each rank's aux loss is the global batch's. The
all-reduce is differentiable (its backward sums the ranks' gradients); each rank's loss carries
the same global aux, so the data axis' gradient average (DDP, FSDP2, HSDP, or an all-reduce ÷ N by
hand) leaves exactly the gradient of the one-device aux loss.

The ranks that pool are the data ranks (dp, fsdp, ep: those that see different rows); TP ranks
see the same rows and must not pool (they would count every token tp times).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn

from steps.models.moe import MoE


class PooledStatsMoE(MoE):
    """MoE whose load-balancing statistics are summed over the data ranks. Built by swapping the
    class of a MoE (pool_router_stats) and setting `pool_sum` and `pool`."""

    pool_sum: Callable  # (t,) -> sum over the data ranks; backward: the sum of their gradients
    pool: int  # how many data ranks pool (every one holds the same number of tokens)

    def pool_stats(self, counts, prob_sum, n_tokens: int) -> tuple:
        both = self.pool_sum(torch.cat([counts, prob_sum]))  # (2E,) over the data ranks
        return both[: self.n_experts], both[self.n_experts :], n_tokens * self.pool


def moe_layers(model) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def pool_router_stats(model, pool_sum: Callable, pool: int, cls: type = PooledStatsMoE) -> None:
    """In place: every MoE layer of `model` pools its load-balancing statistics through `pool_sum`
    over `pool` data ranks (`cls`: the subclass to become, e.g. expert parallelism's)."""
    for moe in moe_layers(model):
        moe.__class__ = cls
        moe.pool_sum, moe.pool = pool_sum, pool


def pool_over_data_axes(model, mesh) -> None:
    """The native path's pooling (native/parallelize.py): a MoE's statistics all-reduced over the
    device mesh's dp and fsdp axes (the ranks that see different rows; not tp) with torch's
    differentiable all-reduce. Nothing to do without MoE layers or a data axis."""
    data = tuple(a for a in ("dp", "fsdp") if a in mesh.mesh_dim_names and mesh[a].size() > 1)
    if not data or not moe_layers(model):
        return
    group = (mesh[data]._flatten("router_stats") if len(data) > 1 else mesh[data[0]]).get_group()
    pool_router_stats(model, lambda t: dist_nn.all_reduce(t, group=group), dist.get_world_size(group))
