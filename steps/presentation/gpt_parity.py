"""What the gpt_parity stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

BUG_COLUMNS = ("planted bugs named",)


def columns_for(params: dict) -> list[str]:
    """A cell fills the bug column only when it plants bugs (`bugs`)."""
    return [t for t in SHOWN.columns if t not in BUG_COLUMNS or params.get("bugs")]


SHOWN = Presentation(
    columns={
        "model": "info.model",
        "params": "metrics.n_params",
        "fp64 worst fwd err": "metrics.float64_forward_max_err",
        "fp64 worst grad err": "metrics.float64_gradient_max_err",
        "fp32 logits err": "metrics.float32_logits_err",
        "greedy == HF": "metrics.greedy_match",
        "all pass": "metrics.all_pass",
        "planted bugs named": "metrics.bugs_localised",  # cells with `bugs`: share flagged first at the expected point
    },
    columns_for=columns_for,
    headline=("worst fp64 gradient error vs HF (GPT-2, Llama, Mixtral)", "fp64 worst grad err", "max"),
    tables=["bugs"],  # cells with `bugs`: each planted bug, the first point flagged and its error, per dtype
)
