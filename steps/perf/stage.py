"""perf: one cell of the single-device performance matrix (a GPT training step with some knobs
changed from the baseline), timed, with its memory accounted for.

Per cell: tokens/s (median and p10/p90 of the timed steps after warm-up), MFU against the matmul
peak measured in this job for the cell's dtype, peak memory, loss after warm-up + timed steps
from the same seed, and loss drift against the baseline cell (read from its metrics.json: the
rule makes every other cell depend on it). `speedup` (× baseline) is measured side by side: the
baseline's step is built in this process too (from the baseline cell's resolved config) and each
timed step of the cell is paired with one of it, A B / B A (steps/paired.py); the ratio is the
geometric mean over the pairs with a 95 % interval (`speedup_low`/`_high`, `speedup_pairs`;
the raw pairs in pairs.csv).
The baseline cell runs the same against a second copy of itself: an A/A noise check. The
timeline cell also records the seed's memory timeline over its first two steps.

The parts: compare.py (the cell against its baseline), measure.py (the training loop, tokens/s,
MFU), footprint.py (peak memory, the analytic-vs-measured table), timeline.py (the memory
timeline), step.py (the training step and its knobs), memory.py (memory measured; the analytic model:
steps/analytic/memory.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from steps import hardware
from steps.analytic.memory import step_memory
from steps.core import StageRun
from steps.models.train_step import set_tf32
from steps.paired import Ratio
from steps.perf import memory
from steps.perf.compare import baseline_params, compare_to_baseline, describe_cell, speed_ratio
from steps.perf.config import PerfConfig
from steps.perf.footprint import memory_metrics, memory_table
from steps.perf.measure import Stepper, throughput, timed_pairs, warm_up
from steps.perf.memory import MiB
from steps.perf.step import build_step, check_device, check_native_amp, gpt_config, micro_batch, peak_dtype
from steps.perf.timeline import Timeline, check_timeline


def timed_against_baseline(
    ctx: StageRun, p: PerfConfig, cell: Stepper, bp: PerfConfig | None
) -> tuple[np.ndarray, Ratio | None, dict]:
    """The cell's timed steps, each paired with a step of the baseline built here from its config
    `bp` (same seed, its own batch pool): (cell step seconds, × baseline, the baseline's
    tokens/s in this process). Without a baseline config the cell is timed alone."""
    if bp is None:
        ctx.info["speedup_note"] = "no baseline record: timed alone"
        n = p.timed_steps
        return np.array([cell.timed() for _ in ctx.progress(range(n), desc=f"perf:{ctx.cell}")]), None, {}
    torch.manual_seed(ctx.seed)
    baseline = Stepper(build_step(bp, ctx.device)[0], bp, ctx.seed)
    times, base_times = timed_pairs(ctx, p, cell, baseline)
    ratio = speed_ratio(times, cell.tokens, base_times, baseline.tokens)
    pairs = {"cell_s": times, "baseline_s": base_times, "cell_first": np.arange(len(times)) % 2 == 0}
    ctx.log_table(pd.DataFrame({**pairs, "cell_tokens": cell.tokens, "baseline_tokens": baseline.tokens}), "pairs")
    return times, ratio, {"baseline_tokens_per_s": float(np.median(baseline.tokens / base_times))}


def run(ctx: StageRun) -> dict:
    p = PerfConfig.of(ctx.params)
    base = describe_cell(ctx, p)
    device = ctx.device
    ctx.info |= {"device": device.type, "peak_dtype": peak_dtype(p)}
    check_device(p, device)
    check_native_amp(p, device)
    is_timeline = ctx.cell == p.timeline_cell
    if is_timeline:
        check_timeline(p)
    set_tf32(p.tf32, device)  # the peak must be measured in the mode the cell runs in
    peaks = hardware.peak_flops(peak_dtype(p), device, n=p.peak_matmul_size)
    ctx.info["published_peak"] = peaks["published_name"]
    micro = micro_batch(p)
    analytic = step_memory(
        gpt_config(p), micro, p.amp, p.checkpoint_activations, p.attn, grad_accum=p.grad_accum, optimizer=p.optimizer
    )

    timeline = Timeline(device, analytic) if is_timeline else None
    torch.manual_seed(ctx.seed)
    ts, fused = build_step(p, device, probe=timeline)
    if timeline:
        timeline.attach(ts)
    cell = Stepper(ts, p, ctx.seed)
    warm_times, mem_peak = warm_up(ctx, p, cell, timeline)
    times, ratio, base_tps = timed_against_baseline(ctx, p, cell, baseline_params(ctx, p, base))
    for i, (dt, loss) in enumerate(zip([*warm_times, *times], cell.losses)):
        ctx.log_metrics({"train_loss": loss, "step_time_ms": dt * 1e3}, step=i)
    metrics = throughput(ts, cell.tokens, times, peaks)
    metrics |= {"first_step_s": warm_times[0], "loss": cell.losses[-1], **mem_peak, **base_tps}
    compare_to_baseline(ctx, p, base, metrics, ratio)
    ctx.info["fused_modules"] = fused

    mt = memory_table(ts, micro, analytic, mem_peak["peak_mem_mib"] * MiB, p.compile)
    ctx.log_table(mt, "memory")
    metrics |= memory_metrics(mt, analytic)
    if timeline:
        df = timeline.table()
        ctx.log_table(df, "memory_timeline")
        ctx.log_figure(memory.plot_timeline(df.to_dict("records")), "memory_timeline")
    return metrics
