"""One tokeniser for every cell, so the trainer and gensim see exactly the same words."""

from __future__ import annotations

import re
from typing import Iterable

WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")
# gensim silently truncates sentences longer than 10 000 tokens; whole plays are longer, so
# documents are cut into pieces no longer than this, identically for both trainers.
MAX_SENTENCE = 10_000


def tokenize(text: str) -> list[str]:
    """Lowercase words made of letters (inner apostrophes kept: o'er, 'tis -> tis)."""
    return WORD.findall(text.lower())


def sentences(texts: Iterable[str], max_len: int = MAX_SENTENCE) -> list[list[str]]:
    out = []
    for text in texts:
        toks = tokenize(text)
        out.extend(toks[i : i + max_len] for i in range(0, len(toks), max_len))
    return [s for s in out if s]
