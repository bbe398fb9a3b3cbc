"""What the gpt_parity stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

SHOWN = Presentation(
    columns={
        "model": "info.model",
        "params": "metrics.n_params",
        "fp64 worst fwd err": "metrics.float64_forward_max_err",
        "fp64 worst grad err": "metrics.float64_gradient_max_err",
        "fp32 logits err": "metrics.float32_logits_err",
        "greedy == HF": "metrics.greedy_match",
        "all pass": "metrics.all_pass",
    },
    headline=("worst fp64 gradient error vs HF (GPT-2, Llama, Mixtral)", "fp64 worst grad err", "max"),
)
