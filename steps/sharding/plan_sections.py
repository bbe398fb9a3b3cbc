"""The sharding section's nested sections as dataclasses: sharding.mlp, sharding.launch and
sharding.fault (Plan's mlp, launch and fault: plan.py). Torch-free, as the plan.

Their fields are in the order of the job's JSON (sorted keys), so Plan.to_dict, what the ranks
receive and the stage logs as its `plan` tag, says what it said when they were dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class Mlp:
    """sharding.mlp: the toy MLP's sizes."""

    dim: int = 32
    hidden: int = 64
    layers: int = 4


@dataclass(frozen=True, kw_only=True)
class Launch:
    """sharding.launch: where the ranks run and how long they may take (nodes.py: several nodes)."""

    dist_backend: Literal["gloo", "nccl"] = "gloo"
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""  # host:port of node 0; "" = torchrun --standalone
    rdzv_id: str = "sharding"
    timeout_s: float = 120  # a dead or hung rank fails the cell after this
    start_method: Literal["auto", "exec", "forkserver"] = "auto"  # launch.forked_ranks


@dataclass(frozen=True, kw_only=True)
class Fault:
    """sharding.fault, test fixtures (worker.py): a rank that exits or hangs (kill_rank), a replica
    that drifts (diverge_rank), every rank pausing before a step (hold_s: the cut-link test), a rank
    whose gradients are scaled wrong before one optimizer step (scale_grad_rank)."""

    at_step: int = 1
    diverge_by: float = 1e-3
    diverge_param: str = ""
    diverge_rank: int = -1
    hold_s: float = 0
    kill_rank: int = -1
    mode: Literal["exit", "hang"] = "exit"
    scale_grad_by: float = 1.0
    scale_grad_rank: int = -1
