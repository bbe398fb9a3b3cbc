"""What the gpt_train stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

BENCH_COLUMNS = ("ours/HF fp32", "ours/HF bf16", "fp32 bench % peak")


def columns_for(params: dict) -> list[str]:
    """The benchmark's columns only where the cell benchmarks (fine-tuning cells switch it off)."""
    bench = (params.get("bench") or {}).get("enabled", True)
    return [t for t in SHOWN.columns if bench or t not in BENCH_COLUMNS]


SHOWN = Presentation(
    columns={
        "params (non-emb)": "metrics.n_params_non_embedding",
        "steps": "metrics.steps",
        "val loss start": "metrics.val_loss_initial",
        "val loss end": "metrics.val_loss_final",
        "val ppl": "metrics.val_ppl_final",
        "tokens/s": "metrics.tokens_per_s",
        "MFU": "metrics.mfu",
        "MFU (published peak)": "metrics.mfu_published",
        # "1.01x [0.97, 1.05] (20 pairs, no difference)": interleaved, 95 % interval
        "ours/HF fp32": "info.bench_float32_ours_vs_hf",
        "ours/HF bf16": "info.bench_bfloat16_ours_vs_hf",
        "fp32 bench % peak": "metrics.bench_float32_ours_pct_peak",  # the benchmark table's % (not the fraction)
        # fine-tuning (init_from) with or without LoRA: what trains and what AdamW keeps for it
        "trainable params": "metrics.trainable_params",
        "AdamW state bytes": "metrics.optimizer_state_bytes",
        "AdamW state bytes (analytic)": "metrics.optimizer_state_bytes_analytic",
    },
    columns_for=columns_for,
    headline=("validation loss after training", "val loss end", "min"),
    curves=["train_loss", "val_loss"],
    system_metrics=True,  # a training job: CPU, memory (GPU on CUDA) in its run's system metrics
    tables=["benchmark", "seeds"],  # seeds: each seed's outcomes (a seed group, steps/core/job.py)
)
