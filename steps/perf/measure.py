"""Timing a perf cell: its warm-up and timed steps on the fixed batch pool (step times, losses,
the peak memory of the last warm-up step), and the timed steps as tokens/s and MFU."""

from __future__ import annotations

import math
from contextlib import ExitStack

import numpy as np

from steps import hardware
from steps.perf.footprint import PeakMemory
from steps.perf.step import micro_batches, synthetic_batches
from steps.perf.timeline import Timeline
from steps.tracking import StageRun


def train(ctx: StageRun, ts, timeline: Timeline | None) -> tuple[list, list, dict]:
    """warm-up + timed steps on the fixed batch pool: step times, losses, peak memory (of the
    last warm-up step; the timed steps run with the CPU allocator reusing freed blocks)."""
    p = ctx.params
    batches = [micro_batches(x, p) for x in synthetic_batches(p, ctx.seed, ts.device)]
    n_warm, n = p["warmup_steps"], p["warmup_steps"] + p["timed_steps"]
    peak_mem, mem = PeakMemory(ts.device), {}
    times, losses = [], []
    with ExitStack() as timed_mode:
        for i in ctx.progress(range(n), total=n, desc=f"perf:{ctx.cell}"):
            x = batches[i % len(batches)]
            if i == n_warm - 1:
                peak_mem.reset(ts)
            if i == n_warm:
                mem = peak_mem.read()
                if ts.device.type == "cpu":
                    timed_mode.enter_context(hardware.reuse_freed_memory())
            if timeline and timeline.active:  # the first (warm-up) steps, instrumented
                dt, loss = timeline.step(ts, x)
            else:
                dt, loss = ts.timed_step(x)
            times.append(dt)
            losses.append(loss)
            ctx.log_metrics({"train_loss": loss, "step_time_ms": dt * 1e3}, step=i)
    return times, losses, mem


def throughput(ts, tokens_per_step: int, timed: np.ndarray, peaks: dict) -> dict:
    """tokens/s median and p10/p90 over the timed steps, and MFU in model FLOPs (6N + 12·L·d·T,
    recomputation by checkpointing not counted) against the measured and the published peak
    (`peaks` as hardware.peak_flops returns it)."""
    cfg = ts.model.config
    tps = tokens_per_step / timed
    fpt = hardware.gpt_flops_per_token(ts.model.num_params(non_embedding=True), cfg.n_layer, cfg.n_embd, cfg.block_size)
    med = float(np.median(tps))
    return {
        "tokens_per_s": med,
        "tokens_per_s_p10": float(np.percentile(tps, 10)),
        "tokens_per_s_p90": float(np.percentile(tps, 90)),
        "step_time_ms": float(np.median(timed)) * 1e3,
        "peak_flops": peaks["measured"],
        "published_peak_flops": peaks.get("published") or math.nan,
        "flops_per_token": fpt,
        "achieved_flops": fpt * med,
        **hardware.mfu(fpt * med, peaks),
    }
