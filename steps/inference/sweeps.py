"""The inference cells that sweep a knob: attention variants, batch size, and ours vs HF."""

from __future__ import annotations

import math
import statistics

import pandas as pd
import torch

from steps.analytic.kv_cache import max_batch
from steps.inference.cells import cache_shape, device_sync, hf_generate, timed_pair
from steps.inference.decode import build_model, cache_bytes, decode, prefill, prompt_ids, weight_bytes
from steps.paired import duration

MIB = 2**20
MEASURE_BATCH = 8


def attention(ctx, p, device) -> dict:
    """MHA vs GQA vs MQA at the same width (n_head query heads each; only the key/value heads
    differ): cache bytes per token, decode tokens/s at the longest context (interleaved against the
    first variant, MHA), and the largest batch of full-length sequences the memory budget holds."""
    budget, rows = p.memory_budget_mib * MIB, []
    models = {kv: build_model(p.model, p.dtype, p.init_seed, device, n_kv_head=kv) for kv in p.kv_heads}
    base_kv = p.kv_heads[0]
    block = models[base_kv].config.block_size
    context = block - p.new_tokens
    ids = prompt_ids(models[base_kv].config.vocab_size, 1, context, p.init_seed + 1, device)
    firsts = {kv: prefill(m, ids) for kv, m in models.items()}
    for kv, model in ctx.progress(models.items(), desc="variants"):
        shape, n_head = cache_shape(model), model.config.n_head
        t_variant, t_base, r = timed_pair(
            lambda: decode(model, ids, p.new_tokens, True, firsts[kv]),
            lambda: decode(models[base_kv], ids, p.new_tokens, True, firsts[base_kv]),
            p,
            device_sync(device),
        )
        predicted = max_batch(shape, block, budget, weight_bytes(model))
        # a real prefill of full-length sequences, its cache read from its tensors; at most
        # MEASURE_BATCH of them (the prefill's logits, not the cache, would fill the memory first)
        batch = min(max(predicted, 1), MEASURE_BATCH)
        full = prompt_ids(model.config.vocab_size, batch, block, p.init_seed + 2, device)
        per_seq = cache_bytes(prefill(model, full).past_key_values) / batch
        rows.append(
            {
                "variant": "MHA" if kv == n_head else "MQA" if kv == 1 else f"GQA-{kv}",
                "kv heads": kv,
                "params": sum(t.numel() for t in model.parameters()),
                "cache bytes/token (measured)": per_seq / block,
                "cache bytes/token (formula)": shape.bytes_per_token(),
                "decode tokens/s": p.new_tokens / t_variant,
                **{k.replace("x", "× MHA", 1): v for k, v in r.as_metrics("x").items()},
                "max batch (predicted)": predicted,
                # arithmetic on the measured cache bytes (nothing allocated at that batch): computed
                "max batch (computed)": int((budget - weight_bytes(model)) // per_seq),
            }
        )
    df = pd.DataFrame(rows)
    ctx.log_table(df, "attention")
    mqa = df.iloc[df["kv heads"].idxmin()]
    mha = df.iloc[0]
    return {
        "cache_per_token_mha_over_mqa": float(
            mha["cache bytes/token (measured)"] / mqa["cache bytes/token (measured)"]
        ),
        "max_batch_mqa_over_mha": float(mqa["max batch (computed)"] / max(mha["max batch (computed)"], 1)),
        "mqa_decode_vs_mha": float(mqa["× MHA"]),
        "mqa_decode_vs_mha_low": float(mqa["× MHA_low"]),
        "mqa_decode_vs_mha_high": float(mqa["× MHA_high"]),
        "mqa_decode_vs_mha_pairs": int(mqa["× MHA_pairs"]),
        "cache_bytes_match": float((df["cache bytes/token (measured)"] == df["cache bytes/token (formula)"]).all()),
        "max_batch_match": float((df["max batch (computed)"] == df["max batch (predicted)"]).all()),
    }


def batching(ctx, p, device) -> dict:
    """Prefill and decode timed apart per batch size (median of `repeats`, with min and max)."""
    model, sync, rows = build_model(p.model, p.dtype, p.init_seed, device), device_sync(device), []
    for b in ctx.progress(p.batch_sizes, desc="batch sizes"):
        ids = prompt_ids(model.config.vocab_size, b, p.prompt_len, p.init_seed + 1, device)
        first = prefill(model, ids)
        decode(model, ids, p.new_tokens, True, first)  # warm-up
        pre = [duration(lambda: prefill(model, ids), sync) for _ in range(p.repeats)]
        dec = [duration(lambda: decode(model, ids, p.new_tokens, True, first), sync) for _ in range(p.repeats)]
        per_token = [t / p.new_tokens for t in dec]
        rows.append(
            {
                "batch": b,
                "prefill tokens/s": b * p.prompt_len / statistics.median(pre),
                "decode ms/token": 1e3 * statistics.median(per_token),
                "decode ms/token min": 1e3 * min(per_token),
                "decode ms/token max": 1e3 * max(per_token),
                "decode tokens/s": b / statistics.median(per_token),
            }
        )
    df = pd.DataFrame(rows)
    ctx.log_table(df, "batching")
    ctx.log_figure(latency_throughput_figure(df), "latency_throughput")
    return {
        "decode_tokens_per_s_b1": float(df["decode tokens/s"].iloc[0]),
        "decode_tokens_per_s_max": float(df["decode tokens/s"].max()),
        "throughput_gain": float(df["decode tokens/s"].max() / df["decode tokens/s"].iloc[0]),
        "latency_ms_b1": float(df["decode ms/token"].iloc[0]),
        "latency_ms_at_max_batch": float(df["decode ms/token"].iloc[-1]),
    }


def latency_throughput_figure(df):
    """Decode: per-token latency against throughput, one point per batch size; prefill beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(df["decode tokens/s"], df["decode ms/token"], marker="o")
    for _, r in df.iterrows():
        left.annotate(f"B{int(r['batch'])}", (r["decode tokens/s"], r["decode ms/token"]), fontsize=8)
    left.set(xlabel="decode throughput (tokens/s)", ylabel="per-token latency (ms)", title="decode")
    right.plot(df["batch"], df["prefill tokens/s"], marker="o")
    right.set(xlabel="batch", ylabel="prefill tokens/s", xscale="log", title="prefill")
    fig.tight_layout()
    return fig


def vs_hf(ctx, p, device) -> dict:
    """Our decode against HF GPT-2's on the same weights. `loop`: both models in the one greedy loop
    (decode.decode): the gap is the models' forward. `generate`: each library's own generate (ours:
    steps.models.generate, HF's with its logits processors, stopping criteria and Cache object): the
    gap between the two ratios is the loops around the models."""
    from steps.models.generate import generate
    from steps.models.hf_convert import to_hf

    ours = build_model(p.model, p.dtype, p.init_seed, device)
    hf = to_hf(ours)
    ids = prompt_ids(ours.config.vocab_size, 1, p.prompt_len, p.init_seed + 1, device)
    n, sync = p.new_tokens, device_sync(device)
    t_ours, t_hf, loop = timed_pair(lambda: decode(ours, ids, n, True), lambda: decode(hf, ids, n, True), p, sync)
    g_ours, g_hf, lib = timed_pair(
        lambda: generate(ours, ids, n), lambda: hf_generate(hf, ids, n, do_sample=False), p, sync
    )
    same = torch.equal(generate(ours, ids, n), hf_generate(hf, ids, n, do_sample=False))
    df = pd.DataFrame(
        [
            {"timed": "same loop (models)", "ours tokens/s": n / t_ours, "HF tokens/s": n / t_hf, **loop.to_dict()},
            {"timed": "each generate (loops)", "ours tokens/s": n / g_ours, "HF tokens/s": n / g_hf, **lib.to_dict()},
        ]
    )
    ctx.log_table(df, "vs_hf")
    return {
        "ours_tokens_per_s": n / g_ours,
        "hf_tokens_per_s": n / g_hf,
        **lib.as_metrics("ours_vs_hf"),
        **loop.as_metrics("ours_vs_hf_forward"),
        "loop_share_of_gap": _loop_share(loop.ratio, lib.ratio),
        "same_tokens": float(same),
    }


def _loop_share(forward_ratio: float, generate_ratio: float) -> float:
    """Of the log-gap between the libraries' generate, the share not explained by the models'
    forward (0: the forward is all of it; 1: the loop is). NaN when there is no gap."""
    total = math.log(generate_ratio)
    return (total - math.log(forward_ratio)) / total if abs(total) > 1e-9 else float("nan")
