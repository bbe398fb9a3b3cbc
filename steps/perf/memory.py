"""Where the memory of one GPT training step goes, measured: the analytic model it is set against
is steps/analytic/memory.py (step_memory, timeline_bytes), from the GPTConfig alone.

Measured:
  state       summed bytes of the distinct storages of params, grads and optimizer state (exact)
  saved       bytes of the distinct non-parameter storages autograd saves for backward, counted
              with torch.autograd.graph.saved_tensors_hooks (exact for eager; torch.compile's
              AOTAutograd graph saves its own set, so compiled cells are not counted)
  process     CUDA: allocator stats; CPU: RSS/VmHWM, meaningful only with MALLOC_MMAP_THRESHOLD_
              set low (glibc otherwise keeps freed blocks, so RSS never goes down)
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from steps import hardware

MiB = 2**20


def _storage_key(t: torch.Tensor):
    return (t.device, t.untyped_storage().data_ptr())


def _unique_bytes(tensors) -> int:
    seen: dict = {}
    for t in tensors:
        if t is not None:
            seen[_storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def state_bytes(model: torch.nn.Module, optimizer=None) -> dict[str, int]:
    """Measured bytes of params, grads and optimizer state (distinct storages: tied weights once)."""
    params = list(model.parameters())
    opt = [v for s in (optimizer.state.values() if optimizer else []) for v in s.values() if torch.is_tensor(v)]
    out = {
        "params": _unique_bytes(params),
        "grads": _unique_bytes(p.grad for p in params),
        "optimizer": _unique_bytes(opt),
    }
    out["state"] = sum(out.values())
    return out


class SavedTensorMeter:
    """Counts bytes autograd saves for backward (distinct non-parameter storages) while active."""

    def __init__(self, model: torch.nn.Module):
        self.exclude = {_storage_key(p) for p in model.parameters()}
        self.storages: dict = {}

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def reset(self) -> None:
        self.storages.clear()

    def _pack(self, t: torch.Tensor):
        key = _storage_key(t)
        if key not in self.exclude:
            self.storages[key] = t.untyped_storage().nbytes()
        return t

    @contextmanager
    def __call__(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self


class MemoryProbe:
    """Snapshots at named checkpoints. CUDA: allocator stats. CPU: RSS (delta since creation)
    plus tracked tensor bytes (params + grads + optimizer state + saved activations)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.hw = hardware
        self.rss0 = hardware.rss_bytes()
        self.rows: list[dict] = []

    def __call__(
        self, label: str, iteration: int = -1, model=None, optimizer=None, saved: int = 0, analytic: float = math.nan
    ) -> dict:
        row = {"iteration": iteration, "checkpoint": label}
        tracked = (state_bytes(model, optimizer)["state"] if model is not None else 0) + saved
        if self.cuda:
            torch.cuda.synchronize()
            row |= {
                "allocated_mib": torch.cuda.memory_allocated() / MiB,
                "reserved_mib": torch.cuda.memory_reserved() / MiB,
            }
        else:
            row |= {"tensor_mib": tracked / MiB, "rss_delta_mib": (self.hw.rss_bytes() - self.rss0) / MiB}
        row["analytic_mib"] = analytic / MiB
        self.rows.append(row)
        return row


def plot_timeline(rows: list[dict]):
    """Line plot of the timeline: measured series next to the analytic one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['iteration']}:{r['checkpoint']}" if r["iteration"] >= 0 else r["checkpoint"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 4))
    for key in [k for k in rows[0] if k.endswith("_mib")]:
        ax.plot(range(len(rows)), [r[key] for r in rows], marker="o", label=key.removesuffix("_mib"))
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("MiB")
    ax.set_title("memory timeline of one training step (two iterations)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig
