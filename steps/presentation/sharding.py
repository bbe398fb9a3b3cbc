"""What the sharding stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

SHOWN = Presentation(
    columns={
        "backend": "info.backend",
        "strategy": "info.strategy",
        "mesh": "info.mesh",
        "world": "metrics.world",
        "tokens/s": "metrics.tokens_per_s",
        "state/rank measured÷analytic": "metrics.state_ratio",
        "params · grads · optimizer per rank ÷ one device": "info.state_split",
        "comm/step dispatch-counted÷analytic": "metrics.dispatch_comm_ratio",
        "comm per mesh axis, link (dispatch-counted)": "info.links",
        "parity": "info.parity",
        "worst parity error": "metrics.parity_err_worst",
        "worst error ÷ tolerance": "metrics.parity_err_over_tol",
        "worst of": "info.parity_worst_of",
        "notes": "info.notes",
    },
    headline=(
        "worst parity error ÷ its tolerance (max of |Δloss|, |Δgrad|, |Δparam|, replica spread on every "
        "rank vs one device after K steps; tolerance fp64 1e-12, fp32 1e-5 or, per tensor of a torch cell, twice "
        "one fp32 device's own error against the fp64 run where that is larger)",
        "worst error ÷ tolerance",
        "max",
    ),
)
