"""The timeline cell's memory timeline: the seed's memory checkpoints (inside forward after each
block, after forward, backward, step, zero_grad) over the first two (warm-up) steps, measured
next to the analytic bytes alive at each checkpoint (steps/analytic/memory.py)."""

from __future__ import annotations

import pandas as pd
import torch

from steps.analytic.memory import timeline_bytes
from steps.config import ConfigError
from steps.perf.config import PerfConfig
from steps.perf.memory import MemoryProbe, SavedTensorMeter


class Timeline:
    """The seed's memory checkpoints for the first steps of the timeline cell."""

    def __init__(self, device, analytic: dict):
        warm_lazy_imports(device)  # else RSS jumps at the first optimizer/backward: code, not data
        self.probe, self.analytic = MemoryProbe(device), analytic
        self.meter, self.iteration, self.hooks = None, -1, []

    def __call__(self, label: str, ts=None) -> None:
        model, opt = getattr(ts, "model", None), getattr(ts, "optimizer", None)
        saved = self.meter.bytes if self.meter and label.startswith(("inside", "after forward")) else 0
        if label == "after backward" and self.meter:
            self.meter.reset()  # backward frees what forward saved
        expected = 0.0 if model is None else timeline_bytes(self.analytic, label, bool(opt and opt.state))
        self.probe(label, self.iteration, model, opt, saved, expected)

    def attach(self, ts) -> None:
        """Forward hooks on the blocks: "inside forward i" after block i (eager models only)."""
        self.meter = SavedTensorMeter(ts.model)
        self.hooks = [
            block.register_forward_hook(lambda m, a, o, i=i: self(f"inside forward {i + 1}", ts))
            for i, block in enumerate(ts.model.transformer.h)
        ]

    def step(self, ts, x) -> tuple[float, float]:
        """One instrumented step; hooks come off after `iterations` steps."""
        self.iteration += 1
        with self.meter():
            out = ts.timed_step(x, probe=lambda label: self(label, ts))
        if self.iteration + 1 == self.iterations:
            for h in self.hooks:
                h.remove()
        return out

    iterations = 2

    @property
    def active(self) -> bool:
        return self.iteration + 1 < self.iterations

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.probe.rows)


def warm_lazy_imports(device) -> None:
    """One tiny AdamW step: torch loads optimizer/autograd code lazily, which RSS would count."""
    w = torch.zeros(4, device=device, requires_grad=True)
    opt = torch.optim.AdamW([w])
    (w * 2).sum().backward()
    opt.step()


def check_timeline(p: PerfConfig) -> None:
    if p.compile:
        raise ConfigError("perf.timeline_cell must be an eager cell (hooks do not fire in compiled code)")
    if p.warmup_steps <= Timeline.iterations:
        raise ConfigError(
            f"perf.warmup_steps must exceed the {Timeline.iterations} instrumented "
            "timeline steps: the timed steps must follow a plain warm-up step"
        )
