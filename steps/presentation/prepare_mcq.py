"""What the prepare_mcq stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

SHOWN = Presentation(
    columns={
        "source": "info.source",
        "questions": "metrics.questions",
        "train": "metrics.n_train",
        "validation": "metrics.n_validation",
        "test": "metrics.n_test",
        "templates": "metrics.n_templates",
        "answer balance (max/min letter)": "metrics.answer_balance",
    },
    headline=("distinct questions", "questions", "max"),
    tables=["questions_per_template"],
)
