"""The inference section as a dataclass (defaults: workflow/schemas/inference.schema.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

from steps.config.typed import Section


@dataclass(frozen=True, kw_only=True)
class InferenceConfig(Section):
    kind: str  # parity | kv_cache | attention | batching | vs_hf | partition: what the cell measures
    model: dict  # GPTConfig knobs of the decoded model (GPT-2 layout: learned positions, MHA unless kv_heads)
    dtype: str  # float64 for parity, float32 for speed
    init_seed: int
    prompt_len: int  # prompt tokens per sequence (partition: L, the prefill's tokens and the decode's cached positions)
    new_tokens: int
    contexts: tuple[int, ...]  # kv_cache: prompt lengths the decode starts from
    kv_heads: tuple[int, ...]  # attention: n_kv_head per variant (n_head = MHA, 1 = MQA, between = GQA)
    batch_sizes: tuple[int, ...]  # batching, partition: the sweep
    memory_budget_mib: float  # attention: the budget the largest batch must fit (weights + cache)
    pairs: int  # interleaved pairs per ratio
    warmup: int
    repeats: int  # batching: timings per batch size (median and spread)
    tol_logits: float  # parity: last-step logits, ours cached vs HF and vs ours uncached
    fail_on_mismatch: bool
    chips: tuple[int, ...]  # partition: TPU v4 chip counts the analytic model sweeps (powers of two)
    efficiency: float  # partition: the share of peak FLOP/s a matmul reaches (1 = the roofline)
    job_threads: int  # cores its rule reserves and torch's threads (0 = the global threads)
