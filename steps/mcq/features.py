"""Dataset.map preprocessing and the multiple-choice collator.

Each question becomes 5 sequence pairs, laid out as the Kaggle LLM-Science-Exam notebooks did:
first = context, second = prompt [SEP] option (without context: first = prompt, second = option).
Truncation is `only_first`, so the prompt and the option text always survive and a long context
loses its tail. Question and option side by side in one segment also learned faster than
"prompt [SEP] context" / "option" (validation MAP@3 after 60 steps, see the config notes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from steps.mcq.data import LETTERS


def preprocess(batch: dict, tokenizer, use_context: bool, max_length: int) -> dict:
    """Batched Dataset.map function: 5 tokenized pairs per question, plus `label` when known."""
    n = len(batch["prompt"])
    firsts, seconds = [], []
    for i in range(n):
        ctx = batch["context"][i] if use_context and "context" in batch else ""
        prompt = batch["prompt"][i]
        firsts += [ctx or prompt] * 5
        seconds += [f"{prompt} {tokenizer.sep_token} {batch[k][i]}" if ctx else batch[k][i] for k in LETTERS]
    enc = tokenizer(firsts, seconds, truncation="only_first", max_length=max_length)
    out = {k: [v[i * 5 : (i + 1) * 5] for i in range(n)] for k, v in enc.items()}
    out["length"] = [max(map(len, ids)) for ids in out["input_ids"]]  # for group_by_length
    if "answer" in batch and all(a in LETTERS for a in batch["answer"]):
        out["label"] = [LETTERS.index(a) for a in batch["answer"]]
    return out


@dataclass
class MultipleChoiceCollator:
    """features (each: 5 token lists) -> flatten to 5B sequences -> pad -> reshape to B x 5 x L."""

    tokenizer: object
    pad_to_multiple_of: int | None = 8

    def __call__(self, features: list[dict]) -> dict:
        labels = [f["label"] for f in features] if "label" in features[0] else None
        keys = [k for k in features[0] if k not in ("label", "labels", "length")]
        n_choices = len(features[0]["input_ids"])
        flat = [{k: f[k][c] for k in keys} for f in features for c in range(n_choices)]
        batch = self.tokenizer.pad(flat, padding=True, pad_to_multiple_of=self.pad_to_multiple_of, return_tensors="pt")
        batch = {k: v.view(len(features), n_choices, -1) for k, v in batch.items()}
        if labels is not None:
            batch["labels"] = torch.tensor(labels, dtype=torch.long)
        return batch
