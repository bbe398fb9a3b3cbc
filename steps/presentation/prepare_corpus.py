"""What the prepare_corpus stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

SHOWN = Presentation(
    columns={
        "source": "info.source",
        "train docs": "metrics.train_documents",
        "val docs": "metrics.validation_documents",
        "train words": "metrics.train_words",
        "val words": "metrics.validation_words",
        "characters": "metrics.characters",
    },
    headline=("words in the train split", "train words", "max"),
)
