"""One function per kind of inference cell; each returns its metrics and logs its table.

parity     our cached decoding = our uncached = HF `generate` (greedy, and sampling under one seed),
           last-step logits within tol_logits
kv_cache   cached vs uncached decode, interleaved, as the context grows; cache bytes vs the formula
attention  MHA vs GQA vs MQA at the same width: cache bytes per token, decode speed at long context,
           the largest batch a memory budget holds (measured from tensors, and predicted)
batching   prefill and decode apart against batch size: per-token latency vs throughput
vs_hf      our decode vs HF's on the same weights, in one loop (the models) and in each library's
           own generate (the loops around them): where a gap comes from
"""

from __future__ import annotations

import statistics

import pandas as pd
import torch

from steps.analytic.kv_cache import CacheShape
from steps.inference.decode import build_model, cache_bytes, decode, prefill, prompt_ids
from steps.models.generate import generate
from steps.paired import interleave, ratio_of_pairs


def cache_shape(model) -> CacheShape:
    c = model.config
    return CacheShape(c.n_layer, c.kv_heads, c.n_embd // c.n_head, next(model.parameters()).element_size())


def hf_generate(hf, ids, n: int, **kw):
    return hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **kw
    )


def check_parity(ours, hf, ids, new_tokens: int, seed: int) -> dict:
    """Tokens and last-step logits of our cached decoding against our uncached decoding and HF's
    `generate` on the same weights (`hf`), greedy and sampled (torch's global RNG seeded alike)."""
    cached, cached_logits, _ = decode(ours, ids, new_tokens, use_cache=True)
    uncached, uncached_logits, _ = decode(ours, ids, new_tokens, use_cache=False)
    hf_greedy = hf_generate(hf, ids, new_tokens, do_sample=False)
    with torch.no_grad():
        hf_logits = hf(cached).logits[:, -1]  # (B, V): HF over the whole sequence, no cache
    sampled = {}
    for name, model, kw in (("ours_cached", ours, {}), ("ours_uncached", ours, {"use_cache": False})):
        torch.manual_seed(seed)
        sampled[name] = generate(model, ids, new_tokens, do_sample=True, **kw)
    torch.manual_seed(seed)
    sampled["hf"] = hf_generate(hf, ids, new_tokens, do_sample=True, top_k=0, top_p=1.0, temperature=1.0)
    return {
        "greedy_cached_eq_uncached": float(torch.equal(cached, uncached)),
        "greedy_eq_hf": float(torch.equal(cached, hf_greedy)),
        "sample_cached_eq_uncached": float(torch.equal(sampled["ours_cached"], sampled["ours_uncached"])),
        "sample_eq_hf": float(torch.equal(sampled["ours_cached"], sampled["hf"])),
        "logits_err_vs_hf": float((cached_logits - hf_logits).abs().max()),
        "logits_err_vs_uncached": float((cached_logits - uncached_logits).abs().max()),
    }


def parity(ctx, p, device) -> dict:
    from steps.models.hf_convert import to_hf

    ours = build_model(p.model, p.dtype, p.init_seed, device)
    ids = prompt_ids(ours.config.vocab_size, 2, p.prompt_len, p.init_seed + 1, device)
    m = check_parity(ours, to_hf(ours), ids, p.new_tokens, ctx.seed)
    tokens_ok = all(m[k] == 1.0 for k in m if "_eq_" in k)
    m["all_pass"] = float(tokens_ok and max(m["logits_err_vs_hf"], m["logits_err_vs_uncached"]) <= p.tol_logits)
    m["err_over_tol"] = max(m["logits_err_vs_hf"], m["logits_err_vs_uncached"]) / p.tol_logits
    if not m["all_pass"] and p.fail_on_mismatch:
        raise AssertionError(f"cached decoding differs from its references: {m}")
    return m


def timed_pair(run_a, run_b, p, sync):
    """(A's median seconds, B's median seconds, how many times faster A is with its interval)."""
    a, b = interleave(run_a, run_b, p.pairs, p.warmup, sync=sync)
    return statistics.median(a), statistics.median(b), ratio_of_pairs(a, b)


def device_sync(device):
    return torch.cuda.synchronize if device.type == "cuda" else None


def kv_cache(ctx, p, device) -> dict:
    model = build_model(p.model, p.dtype, p.init_seed, device)
    shape, n, rows = cache_shape(model), p.new_tokens, []
    for context in ctx.progress([c for c in p.contexts if c + n <= model.config.block_size], desc="contexts"):
        ids = prompt_ids(model.config.vocab_size, 1, context, p.init_seed + 1, device)
        first = {flag: prefill(model, ids, flag) for flag in (True, False)}  # decode timed without the prefill
        t_cached, t_full, r = timed_pair(
            lambda: decode(model, ids, n, True, first[True]),
            lambda: decode(model, ids, n, False, first[False]),
            p,
            device_sync(device),
        )
        measured = cache_bytes(decode(model, ids, n, True, first[True])[2].past_key_values)
        rows.append(
            {
                "context": context,
                "cached tokens/s": n / t_cached,
                "uncached tokens/s": n / t_full,
                **{k.replace("speedup", "cache speed-up"): v for k, v in r.as_metrics("speedup").items()},
                "cache bytes (measured)": measured,
                "cache bytes (formula)": shape.bytes(1, context + n),
            }
        )
    df = pd.DataFrame(rows)
    ctx.log_table(df, "kv_cache")
    last = df.iloc[-1]
    return {
        "cache_speedup": float(last["cache speed-up"]),
        "cache_speedup_low": float(last["cache speed-up_low"]),
        "cache_speedup_high": float(last["cache speed-up_high"]),
        "cache_speedup_pairs": int(last["cache speed-up_pairs"]),
        "longest_context": int(last["context"]),
        "cached_tokens_per_s": float(last["cached tokens/s"]),
        "uncached_tokens_per_s": float(last["uncached tokens/s"]),
        "cache_bytes_match": float((df["cache bytes (measured)"] == df["cache bytes (formula)"]).all()),
    }
