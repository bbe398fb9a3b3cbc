"""What the train_tokenizer stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

SHOWN = Presentation(
    columns={
        "tokenizer": "info.tokenizer",
        "vocab": "metrics.vocab_size",
        "train tokens": "metrics.train_tokens",
        "chars/token (val)": "metrics.validation_chars_per_token",
    },
    headline=("characters per token (validation)", "chars/token (val)", "max"),
)
