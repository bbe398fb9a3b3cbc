"""The sharding cells' deliberate faults (plan.fault), test fixtures every rank applies: a rank that
exits or hangs, a pause before a step (a link cut meanwhile), one rank's update or gradients gone
wrong. The cell's own checks must catch each (tests/test_sharding.py, tests/test_zero.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from steps.sharding.plan import Plan


def maybe_fault(plan: Plan, rank: int, step: int, out: Path) -> None:
    """Deliberate failure for the launcher's fail-fast test: a rank that exits or hangs; or every
    rank pausing hold_s before step at_step, after writing out/hold.rank<r> (the cut-link test
    takes a link down meanwhile, so the step's collectives meet a dead link)."""
    f = plan.fault
    if f.hold_s and step == f.at_step:
        (out / f"hold.rank{rank}").write_text(str(time.time()))
        time.sleep(float(f.hold_s))
    if f.kill_rank == rank and step == f.at_step:
        if f.mode == "hang":
            time.sleep(10**6)
        os._exit(17)


@torch.no_grad()
def maybe_diverge(plan: Plan, named_params, rank: int, step: int) -> None:
    """Test fixture (fault.diverge_rank): after the optimizer step of fault.at_step, that rank adds
    fault.diverge_by to one element of its first non-empty parameter whose name contains
    fault.diverge_param ("" = any: its replica or its shard; "experts" = one of its own experts),
    as a bug in one rank's update would. The cell's parity check must fail."""
    f = plan.fault
    if f.diverge_rank != rank or step != f.at_step:
        return
    for name, p in named_params:
        local = p.to_local() if hasattr(p, "to_local") else p
        if local.numel() and f.diverge_param in name:
            local.view(-1)[0] += float(f.diverge_by)
            return


@torch.no_grad()
def maybe_scale_grads(plan: Plan, params, rank: int, step: int) -> None:
    """Test fixture (fault.scale_grad_rank): before the optimizer step of fault.at_step, that rank
    multiplies every gradient it holds by fault.scale_grad_by, as a wrong loss or all-reduce scaling
    on one rank would. The cell's parity check must fail."""
    f = plan.fault
    if f.scale_grad_rank == rank and step == f.at_step:
        for p in params:
            if p.grad is not None:
                (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).mul_(float(f.scale_grad_by))
