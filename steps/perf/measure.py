"""Timing a perf cell: its warm-up steps on the fixed batch pool (the peak memory of the last
one, the timeline cell's instrumented first steps), then its timed steps interleaved with the
baseline's step in the same process (steps/paired.py: A B / B A, pair by pair, under the same
load), and the timed steps as tokens/s and MFU."""

from __future__ import annotations

import math
from contextlib import ExitStack

import numpy as np

from steps import hardware
from steps.analytic.flops import flops_per_token
from steps.core import StageRun
from steps.models.train_step import set_tf32
from steps.paired import interleave
from steps.perf.config import PerfConfig
from steps.perf.footprint import PeakMemory
from steps.perf.step import micro_batches, synthetic_batches
from steps.perf.timeline import Timeline

BASELINE_WARMUP = 2  # a fresh step: AdamW creates its state in step 1, step 2 runs steady


class Stepper:
    """One training step and its batch pool as a callable: each call runs the next batch's step
    (TF32 set to the step's own mode first: the baseline and the cell share the process)."""

    def __init__(self, ts, p: PerfConfig, seed: int):
        self.ts, self.i, self.losses = ts, 0, []
        self.batches = [micro_batches(x, p) for x in synthetic_batches(p, seed, ts.device)]
        self.tokens = p.batch_size * p.model.block_size

    def __call__(self, step=None) -> float:
        """One step (`step(ts, batch) -> (seconds, loss)` instead of the plain step: the timeline's
        instrumented one); returns its duration when `step` gives one."""
        set_tf32(self.ts.opts.tf32, self.ts.device)
        x = self.batches[self.i % len(self.batches)]
        dt, loss = step(self.ts, x) if step else (None, self.ts.step(x)[0])
        self.i += 1
        self.losses.append(loss)
        return dt

    def timed(self) -> float:
        """One step, synchronised so the device work is inside the timer: its seconds."""
        return self(lambda ts, x: ts.timed_step(x))


def warm_up(ctx: StageRun, p: PerfConfig, cell: Stepper, timeline: Timeline | None) -> tuple[list, dict]:
    """The cell's warm-up steps: their times, and the peak memory of the last one (before the
    baseline's step exists in this process; the timed steps run with the CPU allocator reusing
    freed blocks, where RSS no longer follows tensor bytes)."""
    n = p.warmup_steps
    peak_mem, times = PeakMemory(cell.ts.device), []
    for i in ctx.progress(range(n), total=n, desc=f"perf:{ctx.cell} warm-up"):
        if i == n - 1:
            peak_mem.reset(cell.ts)
        # the first (warm-up) steps of the timeline cell are instrumented
        times.append(cell(timeline.step) if timeline and timeline.active else cell.timed())
    return times, peak_mem.read()


def timed_pairs(ctx: StageRun, p: PerfConfig, cell: Stepper, base: Stepper) -> tuple[np.ndarray, np.ndarray]:
    """`timed_steps` pairs of (cell step, baseline step), interleaved A B / B A after the
    baseline's own warm-up: the durations of each, in seconds."""
    n = p.timed_steps
    for _ in range(BASELINE_WARMUP):  # as the cell's warm-up: its AdamW state allocated the same way
        base()
    with ExitStack() as stack:
        if cell.ts.device.type == "cpu":
            stack.enter_context(hardware.reuse_freed_memory())
        bar = stack.enter_context(ctx.progress(total=n, desc=f"perf:{ctx.cell} vs baseline"))

        def run_cell():
            cell()
            bar.update()

        a, b = interleave(run_cell, base, pairs=n, warmup=0, sync=cell.ts.sync)
    return np.asarray(a), np.asarray(b)


def throughput(ts, tokens_per_step: int, timed: np.ndarray, peaks: dict) -> dict:
    """tokens/s median and p10/p90 over the timed steps, and MFU in model FLOPs (6N + 12·L·d·T,
    recomputation by checkpointing not counted) against the measured and the published peak
    (`peaks` as hardware.peak_flops returns it)."""
    cfg = ts.model.config
    tps = tokens_per_step / timed
    fpt = flops_per_token(ts.model.num_params(non_embedding=True), cfg.n_layer, cfg.n_embd, cfg.block_size)
    med = float(np.median(tps))
    return {
        "tokens_per_s": med,
        "tokens_per_s_p10": float(np.percentile(tps, 10)),
        "tokens_per_s_p90": float(np.percentile(tps, 90)),
        "step_time_ms_median": float(np.median(timed)) * 1e3,  # not `step_time_ms`: the per-step curve
        "peak_flops": peaks["measured"],
        "published_peak_flops": peaks.get("published") or math.nan,
        "flops_per_token": fpt,
        "achieved_flops": fpt * med,
        **hardware.mfu(fpt * med, peaks),
    }
