"""A perf cell's memory footprint: the peak of a full steady-state step (CUDA allocator peaks, or
VmHWM growth on CPU) and the analytic-vs-measured table of one step's memory (state, saved
activations, peak), with the metrics the report reads from it."""

from __future__ import annotations

import math

import pandas as pd
import torch

from steps import hardware
from steps.perf.memory import MiB, SavedTensorMeter, state_bytes

SAVED_ROW = "saved activations (+autocast weight copies)"


class PeakMemory:
    """Peak memory of the last warm-up step, a full steady-state step (the timed steps follow
    with the CPU allocator in reuse mode, where RSS no longer follows tensor bytes: see
    hardware.reuse_freed_memory). CUDA: allocator peaks. CPU: VmHWM growth over the RSS at the
    start of that step, plus the tensors alive then (params + optimizer state, counted exactly):
    code and caches loaded earlier (oneDNN kernels JIT-compiled for bf16/AMX, inductor
    artifacts, lazily imported modules) are RSS but not training memory."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.rss_reset = self.alive = 0

    def reset(self, ts) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        self.alive = state_bytes(ts.model, ts.optimizer)["state"]
        self.rss_reset = hardware.rss_bytes()
        hardware.reset_peak_rss()

    def read(self) -> dict:
        if self.cuda:
            return {
                "peak_mem_mib": torch.cuda.max_memory_allocated() / MiB,
                "peak_reserved_mib": torch.cuda.max_memory_reserved() / MiB,
            }
        return {"peak_mem_mib": (hardware.peak_rss_bytes() - self.rss_reset + self.alive) / MiB}


def memory_table(ts, micro_batch: int, analytic: dict, peak_bytes: float, compiled: bool) -> pd.DataFrame:
    """Analytic vs measured: state (summed tensor bytes), saved activations, process peak."""
    x = ts_batch(ts, micro_batch)
    meter = SavedTensorMeter(ts.model)
    with meter(), ts.autocast():
        loss = ts.forward(x, labels=x).loss
    ts.backward(loss)
    measured = state_bytes(ts.model, ts.optimizer)
    ts.optimizer.zero_grad(set_to_none=True)  # no update: the cell's loss trajectory is untouched
    saved = math.nan if compiled else meter.bytes
    rows = [(k, analytic[k], measured[k]) for k in ("params", "grads", "optimizer", "state")]
    rows.append((SAVED_ROW, analytic["activations"] + analytic["autocast_weights"], saved))
    rows.append(("logits + cross-entropy gradients", analytic["logits"] + analytic["loss_backward"], math.nan))
    rows.append(("peak of a step", analytic["peak"], peak_bytes))
    df = pd.DataFrame(rows, columns=["component", "analytic", "measured"])
    return pd.DataFrame(
        {
            "component": df.component,
            "analytic_mib": df.analytic / MiB,
            "measured_mib": df.measured / MiB,
            "err_pct": 100 * (df.measured - df.analytic) / df.analytic,
        }
    )


def memory_metrics(mt: pd.DataFrame, analytic: dict) -> dict:
    """The table's state, saved-activation and peak rows as metrics (analytic, measured, error)."""
    rows = mt.set_index("component")
    metrics = {}
    for key, row in (("state", "state"), ("optimizer", "optimizer"), ("saved", SAVED_ROW)):
        metrics |= {
            f"mem_{key}_analytic_mib": rows.analytic_mib[row],
            f"mem_{key}_measured_mib": rows.measured_mib[row],
            f"mem_{key}_err_pct": rows.err_pct[row],
        }
    metrics["mem_peak_analytic_mib"] = analytic["peak"] / MiB
    metrics["mem_peak_err_pct"] = rows.err_pct["peak of a step"]
    return metrics


def ts_batch(ts, batch: int):
    gen = torch.Generator().manual_seed(0)
    cfg = ts.model.config
    return torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=gen).to(ts.device)
