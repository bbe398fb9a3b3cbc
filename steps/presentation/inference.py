"""What the inference stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

# the columns each kind of cell fills (the rest stay empty in its row)
KIND_COLUMNS = {
    "parity": ["greedy = HF", "sampled = HF", "cached = uncached", "logits err vs HF", "all pass"],
    "kv_cache": [
        "context",
        "cache speed-up",
        "speed-up low",
        "speed-up high",
        "speed-up pairs",
        "cache bytes = formula",
    ],
    "attention": [
        "MQA cache ÷ MHA",
        "MQA max batch × MHA",
        "MQA decode × MHA",
        "× MHA low",
        "× MHA high",
        "× MHA pairs",
        "max batch (computed) = formula",
    ],
    "batching": ["tokens/s B1", "tokens/s best", "throughput gain", "ms/token B1", "ms/token max B"],
    "vs_hf": [
        "ours tokens/s",
        "HF tokens/s",
        "ours × HF",
        "× HF low",
        "× HF high",
        "× HF pairs",
        "forward × HF",
        "loop share",
    ],
    "partition": [
        "predicted decode ms/token",
        "predicted ÷ published decode",
        "predicted prefill MFU",
        "predicted ÷ published MFU",
        "predicted 2D comm fall",
    ],
}


def columns_for(params: dict) -> list[str]:
    return ["kind", *KIND_COLUMNS[params["kind"]]]


SHOWN = Presentation(
    columns={
        "kind": "params.kind",
        "greedy = HF": "metrics.greedy_eq_hf",
        "sampled = HF": "metrics.sample_eq_hf",
        "cached = uncached": "metrics.greedy_cached_eq_uncached",
        "logits err vs HF": "metrics.logits_err_vs_hf",
        "all pass": "metrics.all_pass",
        "context": "metrics.longest_context",
        "cache speed-up": "metrics.cache_speedup",
        "speed-up low": "metrics.cache_speedup_low",
        "speed-up high": "metrics.cache_speedup_high",
        "speed-up pairs": "metrics.cache_speedup_pairs",  # interleaved pairs: a ratio's count is published with it
        "cache bytes = formula": "metrics.cache_bytes_match",
        "MQA cache ÷ MHA": "metrics.cache_per_token_mha_over_mqa",
        "MQA max batch × MHA": "metrics.max_batch_mqa_over_mha",
        "MQA decode × MHA": "metrics.mqa_decode_vs_mha",
        "× MHA low": "metrics.mqa_decode_vs_mha_low",
        "× MHA high": "metrics.mqa_decode_vs_mha_high",
        "× MHA pairs": "metrics.mqa_decode_vs_mha_pairs",
        "max batch (computed) = formula": "metrics.max_batch_match",
        "tokens/s B1": "metrics.decode_tokens_per_s_b1",
        "tokens/s best": "metrics.decode_tokens_per_s_max",
        "throughput gain": "metrics.throughput_gain",
        "ms/token B1": "metrics.latency_ms_b1",
        "ms/token max B": "metrics.latency_ms_at_max_batch",
        "ours tokens/s": "metrics.ours_tokens_per_s",
        "HF tokens/s": "metrics.hf_tokens_per_s",
        "ours × HF": "metrics.ours_vs_hf",
        "× HF low": "metrics.ours_vs_hf_low",
        "× HF high": "metrics.ours_vs_hf_high",
        "× HF pairs": "metrics.ours_vs_hf_pairs",
        "forward × HF": "metrics.ours_vs_hf_forward",
        "loop share": "metrics.loop_share_of_gap",
        "predicted decode ms/token": "metrics.predicted_decode_ms_per_token",
        "predicted ÷ published decode": "metrics.predicted_decode_over_published",
        "predicted prefill MFU": "metrics.predicted_prefill_mfu",
        "predicted ÷ published MFU": "metrics.predicted_prefill_mfu_over_published",
        "predicted 2D comm fall": "metrics.predicted_2d_ws_comm_fewest_over_most_chips",
    },
    headline=("KV-cache decode speed-up at the longest context, interleaved, 95 % interval", "cache speed-up", "max"),
    headline_interval=("speed-up low", "speed-up high"),
    tables=["kv_cache", "attention", "batching", "vs_hf", "partition"],
    columns_for=columns_for,
    # timed on this machine, so they differ run to run (the predicted ones and the bytes do not)
    measured=["cache speed-up", "throughput gain", "ms/token B1", "ms/token max B", "loop share"],
)
