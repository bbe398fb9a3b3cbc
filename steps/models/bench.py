"""gpt_train's benchmark: our GPT against HF GPT2LMHeadModel (same config, init, batch, dtype)
under the one training step (steps.models.train_step: forward, backward, clipping, AdamW),
measured side by side: both steps live in one process and run interleaved, ours HF / HF ours,
pair by pair (steps/paired.py), so background load hits both alike. ours/HF is the geometric
mean of the per-pair speed ratios with a 95 % interval over `bench.pairs` pairs (20 for a
number worth reading; `bench.steps_per_pair` steps each side of a pair).

Dtypes the device has no fast matmul for (bf16 on a CPU without AVX512-BF16/AMX: ~100x slower
than fp32, hours for a number that says nothing about either model) are skipped with the
measured reason.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import torch

from steps.analytic.flops import flops_per_token
from steps.hardware import mfu, slow_matmul_reason
from steps.models.gpt import GPTLMHeadModel
from steps.models.hf_convert import to_hf
from steps.models.train_config import Bench, GptTrainConfig
from steps.models.train_step import StepOptions, TrainStep, amp_of
from steps.paired import Ratio, interleave, ratio_of_pairs


def bench_dtypes(ctx, b: Bench, device) -> list[str]:
    """The benchmark's dtypes this device multiplies natively; the others are named in
    info["bench_skipped"] with the probe's numbers."""
    if not b.enabled:
        return []
    keep = []
    for dt in b.dtypes:
        reason = slow_matmul_reason(dt, device.type)
        if reason:
            ctx.info.setdefault("bench_skipped", {})[dt] = reason
        else:
            keep.append(dt)
    return keep


def paired_steps(ours, hf, batch: torch.Tensor, device, opts: StepOptions, b: Bench, progress=None):
    """Seconds per training step of our model and HF's (each a fresh copy under its own
    TrainStep), interleaved over `b.pairs` pairs after `b.warmup` untimed rounds:
    (ours, hf) arrays, one entry per pair."""
    n = b.steps_per_pair
    bar = progress(total=b.pairs + b.warmup) if progress else None

    def runner(model):
        ts = TrainStep(copy.deepcopy(model).to(device).train(), device, opts)

        def run():
            for _ in range(n):
                ts.step([batch])

        return ts, run

    ts, run_ours = runner(ours)
    _, run_hf = runner(hf)

    def run_ours_and_tick():
        run_ours()
        if bar is not None:
            bar.update()

    a, h = interleave(run_ours_and_tick, run_hf, b.pairs, b.warmup, sync=ts.sync)
    if bar is not None:
        bar.close()
    return np.asarray(a) / n, np.asarray(h) / n


def run_benchmark(ctx, p: GptTrainConfig, cfg, peaks, device) -> dict:
    """Ours vs HF GPT-2 per benchmark dtype: steps/s of each (median over the pairs), ours/HF
    with its interval, our tokens/s and MFU in the benchmark; the `benchmark` table."""
    b = p.bench
    torch.manual_seed(ctx.seed)
    ref = GPTLMHeadModel(cfg)
    try:
        hf_ref = to_hf(ref)
    except ValueError as exc:
        ctx.info["bench"] = f"no HF equivalent: {exc}"
        return {}
    hf_ref.config._attn_implementation = "sdpa"
    gen = torch.Generator().manual_seed(ctx.seed)
    batch = torch.randint(0, cfg.vocab_size, (p.batch_size, cfg.block_size), generator=gen).to(device)
    fpt = flops_per_token(ref.num_params(), cfg.n_layer, cfg.n_embd, cfg.block_size)
    out, rows = {}, []
    for dtype in b.dtypes:
        if dtype in ctx.info.get("bench_skipped", {}):
            rows.append({"dtype": dtype, "skipped": ctx.info["bench_skipped"][dtype]})
            print(f"bench {dtype}: skipped, {ctx.info['bench_skipped'][dtype]}")
            continue
        opts = StepOptions.from_params(p, amp=amp_of(dtype), grad_accum=1)
        progress = lambda **kw: ctx.progress(desc=f"bench {dtype}: ours vs HF", **kw)  # noqa: E731
        ours_s, hf_s = paired_steps(ref, hf_ref, batch, device, opts, b, progress)
        ratio = ratio_of_pairs(ours_s, hf_s)
        out |= bench_metrics(f"bench_{dtype}", ours_s, hf_s, ratio, batch.numel(), fpt, peaks[dtype])
        ctx.info[f"bench_{dtype}_ours_vs_hf"] = str(ratio)
        rows.append(bench_row(dtype, out, f"bench_{dtype}", peaks[dtype]))
        print(f"bench {dtype}: ours/HF {ratio}")
    ctx.log_table(pd.DataFrame(rows), "benchmark")
    return out


def bench_metrics(key: str, ours_s, hf_s, ratio: Ratio, tokens: int, fpt: float, peak: dict) -> dict:
    """Metrics under the same names for every dtype: steps/s (medians over the pairs), ours/HF
    with `_low`, `_high`, `_pairs`, our tokens/s and MFU (measured and published peak)."""
    ours_sps, hf_sps = float(np.median(1 / ours_s)), float(np.median(1 / hf_s))
    bench_mfu = mfu(ours_sps * tokens * fpt, peak)
    return {
        f"{key}_ours_steps_s": ours_sps,
        f"{key}_hf_steps_s": hf_sps,
        **ratio.as_metrics(f"{key}_ours_over_hf"),
        f"{key}_ours_tokens_s": ours_sps * tokens,
        f"{key}_ours_mfu": bench_mfu["mfu"],
        f"{key}_ours_mfu_published": bench_mfu["mfu_published"],
        f"{key}_ours_pct_peak": 100 * bench_mfu["mfu"],  # % of the measured matmul peak: 71.12, not 0.7112
    }


def bench_row(dtype: str, m: dict, key: str, peak: dict) -> dict:
    return {
        "dtype": dtype,
        "ours steps/s": m[f"{key}_ours_steps_s"],
        "HF steps/s": m[f"{key}_hf_steps_s"],
        "ours/HF": m[f"{key}_ours_over_hf"],
        "low": m[f"{key}_ours_over_hf_low"],
        "high": m[f"{key}_ours_over_hf_high"],
        "pairs": m[f"{key}_ours_over_hf_pairs"],
        "ours tokens/s": m[f"{key}_ours_tokens_s"],
        "ours % of measured matmul peak": m[f"{key}_ours_pct_peak"],
        "measured matmul peak GFLOP/s": peak["measured"] / 1e9,
        "ours % of published peak": 100 * m[f"{key}_ours_mfu_published"],
        "published peak": peak["published_name"],
    }
