"""perf: one cell of the single-device performance matrix (a GPT training step with some knobs
changed from the baseline), timed, with its memory accounted for.

Per cell: tokens/s (median and p10/p90 of the timed steps after warm-up), MFU against the matmul
peak measured in this job for the cell's dtype, peak memory, loss after warm-up + timed steps
from the same seed, speedup and loss drift against the baseline cell (read from its
metrics.json: the rule makes every other cell depend on it). The timeline cell also records the
seed's memory timeline over its first two steps.

The parts: compare.py (the cell against its baseline), measure.py (the training loop, tokens/s,
MFU), footprint.py (peak memory, the analytic-vs-measured table), timeline.py (the memory
timeline), step.py (the training step and its knobs), memory.py (the analytic memory model).
"""

from __future__ import annotations

import numpy as np
import torch

from steps import hardware
from steps.models.train_step import set_tf32
from steps.perf import memory
from steps.perf.compare import compare_to_baseline, describe_cell
from steps.perf.footprint import memory_metrics, memory_table
from steps.perf.measure import throughput, train
from steps.perf.memory import MiB
from steps.perf.step import build_step, check_device, check_native_amp, gpt_config, micro_batch, peak_dtype
from steps.perf.timeline import Timeline, check_timeline
from steps.tracking import StageRun


def run(ctx: StageRun) -> dict:
    p = ctx.params
    base = describe_cell(ctx)
    device = ctx.device
    ctx.info |= {"device": device.type, "peak_dtype": peak_dtype(p)}
    check_device(p, device)
    check_native_amp(p, device)
    is_timeline = ctx.cell == p["timeline_cell"]
    if is_timeline:
        check_timeline(p)
    set_tf32(p["tf32"], device)  # the peak must be measured in the mode the cell runs in
    peaks = hardware.peak_flops(peak_dtype(p), device, n=p["peak_matmul_size"])
    ctx.info["published_peak"] = peaks["published_name"]
    micro = micro_batch(p)
    analytic = memory.analytic_memory(
        gpt_config(p), micro, p["amp"], p["checkpoint_activations"], p["attn"], grad_accum=p["grad_accum"]
    )

    timeline = Timeline(device, analytic) if is_timeline else None
    torch.manual_seed(ctx.seed)
    ts, fused = build_step(p, device, probe=timeline)
    if timeline:
        timeline.attach(ts)
    times, losses, mem_peak = train(ctx, ts, timeline)
    tokens_per_step = p["batch_size"] * p["model"]["block_size"]
    metrics = throughput(ts, tokens_per_step, np.array(times[p["warmup_steps"] :]), peaks)
    metrics |= {"first_step_s": times[0], "loss": losses[-1], **mem_peak}
    compare_to_baseline(ctx, base, metrics)
    ctx.info["fused_modules"] = fused

    mt = memory_table(ts, micro, analytic, mem_peak["peak_mem_mib"] * MiB, p["compile"])
    ctx.log_table(mt, "memory")
    metrics |= memory_metrics(mt, analytic)
    if timeline:
        df = timeline.table()
        ctx.log_table(df, "memory_timeline")
        ctx.log_figure(memory.plot_timeline(df.to_dict("records")), "memory_timeline")
    return metrics
