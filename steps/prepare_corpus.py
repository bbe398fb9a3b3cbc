"""prepare_corpus: text sources → an HF DatasetDict (train/validation), the rule's `data` output.

The split is by document and by seed, so the same config always yields byte-identical files.
`streaming: true` reads the documents through a `datasets.IterableDataset` (the hub's
`streaming=True`, or `IterableDataset.from_generator`), filtered and cut lazily and consumed with
iter/next, instead of Python's generators: the same documents, so the same files and tokens
(tests/test_streaming.py).
"""

from __future__ import annotations

import itertools
import random

import datasets
import pandas as pd

from steps.core import InputError, Stage, StageRun
from steps.data.config import PrepareCorpusConfig
from steps.data.text import document_stream, load_documents
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


def map_style_documents(p: PrepareCorpusConfig) -> list[dict]:
    """The documents kept: long enough, the first max_documents of them (0 = all)."""
    docs = (d for d in load_documents(p.source, p.unit, p.text_column, p.encoding) if len(d["text"]) >= p.min_chars)
    return list(itertools.islice(docs, p.max_documents or None))


def streamed_documents(p: PrepareCorpusConfig) -> list[dict]:
    """The same documents through the streaming path: an IterableDataset filtered and cut lazily
    (nothing is read past the last document kept), consumed with the iterator protocol."""
    stream = document_stream(p.source, p.unit, p.text_column, p.encoding)
    stream = stream.filter(lambda d: len(d["text"]) >= p.min_chars)
    if p.max_documents:
        stream = stream.take(p.max_documents)
    docs, it = [], iter(stream)
    while True:
        try:
            docs.append(next(it))
        except StopIteration:
            return docs


def run(ctx: StageRun) -> dict:
    p = PrepareCorpusConfig.of(ctx.params)
    docs = streamed_documents(p) if p.streaming else map_style_documents(p)
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
    ctx.info["path"] = "streaming (IterableDataset)" if p.streaming else "map-style"
    return {**stats, "characters": stats["train_characters"] + stats["validation_characters"]}


STAGE = Stage.of(__spec__.name, run, SHOWN)

if __name__ == "__main__":
    STAGE.main()
