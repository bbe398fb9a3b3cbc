"""prepare_corpus: text sources → an HF DatasetDict (train/validation), the rule's `data` output.

The split is by document and by seed, so the same config always yields byte-identical files.
"""

from __future__ import annotations

import itertools
import random

import datasets
import pandas as pd

from steps.core import InputError, Stage, StageRun
from steps.data.config import PrepareCorpusConfig
from steps.data.text import load_documents
from steps.presentation.prepare_corpus import SHOWN


def split_documents(docs: list[dict], val_fraction: float, seed: int) -> dict[str, list[dict]]:
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(docs) * val_fraction))
    if len(docs) < 2:
        raise InputError(f"corpus has {len(docs)} document(s); need at least 2 to split train/validation")
    val = set(order[:n_val])
    return {
        "train": [d for i, d in enumerate(docs) if i not in val],
        "validation": [d for i, d in enumerate(docs) if i in val],
    }


def run(ctx: StageRun) -> dict:
    p = PrepareCorpusConfig.of(ctx.params)
    docs = (d for d in load_documents(p.source, p.unit, p.text_column, p.encoding) if len(d["text"]) >= p.min_chars)
    docs = list(itertools.islice(docs, p.max_documents or None))
    splits = split_documents(docs, p.val_fraction, ctx.seed)
    dd = datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()})
    dd.save_to_disk(ctx.outputs["data"])
    stats, rows = {}, []
    for split, ds in dd.items():
        words = sum(len(t.split()) for t in ds["text"])
        chars = sum(len(t) for t in ds["text"])
        stats |= {f"{split}_documents": len(ds), f"{split}_words": words, f"{split}_characters": chars}
        rows.append({"split": split, "documents": len(ds), "words": words, "characters": chars})
    ctx.log_table(pd.DataFrame(rows), "corpus_stats")
    ctx.log_text(dd["train"][0]["text"][:2000], "sample.txt")
    ctx.info["source"] = p.source
    return {**stats, "characters": stats["train_characters"] + stats["validation_characters"]}


STAGE = Stage.of(__spec__.name, run, SHOWN)

if __name__ == "__main__":
    STAGE.main()
