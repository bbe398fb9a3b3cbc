"""What the components stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

SHOWN = Presentation(
    columns={
        "checks": "metrics.n_checks",
        "passed": "metrics.n_pass",
        "all pass": "metrics.all_pass",
        "worst err / tol": "metrics.worst_err_over_tol",
    },
    headline=("worst error ÷ tolerance over all checks", "worst err / tol", "max"),
    tables=["parity"],
)
