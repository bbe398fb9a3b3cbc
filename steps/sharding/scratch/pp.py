"""Pipeline parallel from scratch: stage s holds blocks [s·L/S, (s+1)·L/S) and the batch is cut
into M micro-batches. Activations travel forward with send/recv, their gradients backward.

  GPipe: all M forwards, then all M backwards — M micro-batches' activations held at once.
  1F1B : stage s runs S-s-1 warm-up forwards, then alternates one forward / one backward, then
         drains — at most S-s micro-batches in flight, same bubble (S-1)/(M+S-1).
Sends are `isend` (waited at the end of the step) so the 1F1B cross-over never deadlocks;
receives block. The loss of a micro-batch is divided by M so the summed gradients equal the
full-batch gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from steps.sharding import comm
from steps.sharding.toy_mlp import MLP, loss_fn, n_blocks


def schedule_order(kind: str, stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """The (op, micro-batch) sequence one stage runs: ('F', i) or ('B', i)."""
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]


class PipelineMLP(nn.Module):
    def __init__(self, full: dict[str, torch.Tensor], schedule: str = "gpipe", microbatches: int = 4):
        super().__init__()
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        per = n_blocks(full) // self.size
        self.stage = MLP(full, range(self.rank * per, (self.rank + 1) * per))
        self.first, self.last = self.rank == 0, self.rank == self.size - 1
        self.schedule, self.m = schedule, microbatches
        self.max_inflight = 0

    def _fwd(self, i, xs, ys, held, sends):
        if self.first:
            inp = xs[i]
        else:
            inp = comm.recv(torch.empty_like(xs[i]), self.rank - 1).requires_grad_()
        out = self.stage(inp)
        if self.last:
            out = loss_fn(out, ys[i]) / self.m
        else:
            act = out.detach().contiguous()
            sends.append((comm.isend(act, self.rank + 1), act))
        held[i] = (inp, out)
        self.max_inflight = max(self.max_inflight, len(held))

    def _bwd(self, i, held, sends):
        inp, out = held.pop(i)
        if self.last:
            out.backward()
        else:
            out.backward(comm.recv(torch.empty_like(out), self.rank + 1))
        if not self.first:
            g = inp.grad.contiguous()
            sends.append((comm.isend(g, self.rank - 1), g))

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step's forward+backward; returns the full-batch loss (on every rank)."""
        xs, ys = x.chunk(self.m), y.chunk(self.m)
        held, sends, losses = {}, [], []
        for op, i in schedule_order(self.schedule, self.rank, self.size, self.m):
            if op == "F":
                self._fwd(i, xs, ys, held, sends)
                if self.last:
                    losses.append(held[i][1].detach())
            else:
                self._bwd(i, held, sends)
        for work, _ in sends:
            work.wait()
        loss = torch.stack(losses).sum() if self.last else torch.zeros((), dtype=x.dtype)
        dist.broadcast(loss, src=self.size - 1)  # reporting only, not counted
        return loss

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """Every stage's tensors (on the CPU: see comm.gather_state), for the parity check."""
        return comm.gather_state(self.stage.full_state(kind))
