"""What the report stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

SHOWN = Presentation(
    columns={
        "ok": "metrics.cells_ok",
        "skipped": "metrics.cells_skipped",
        "failed": "metrics.cells_failed",
        "missing": "metrics.cells_missing",
    },
)
