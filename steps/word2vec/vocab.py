"""Vocabulary with min_count, frequent-word subsampling and the unigram^0.75 negative table.

The formulas are word2vec's (and gensim's), so the PyTorch trainer and the gensim baseline
drop and sample words with the same probabilities."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import numpy as np


@dataclass
class Vocab:
    words: list[str]  # most frequent first (ties broken alphabetically: deterministic)
    counts: np.ndarray  # int64, same order

    @classmethod
    def build(cls, sentences: Iterable[list[str]], min_count: int = 5) -> "Vocab":
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        c = Counter(w for s in sentences for w in s)
        kept = sorted(((w, n) for w, n in c.items() if n >= min_count), key=lambda x: (-x[1], x[0]))
        if not kept:
            raise ValueError(f"no word occurs min_count={min_count} times: corpus too small")
        return cls([w for w, _ in kept], np.array([n for _, n in kept], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.words)

    @property
    def index(self) -> dict[str, int]:
        if not hasattr(self, "_index"):
            self._index = {w: i for i, w in enumerate(self.words)}
        return self._index

    def encode(self, sentences: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """Flat token ids and sentence ids; out-of-vocabulary words are dropped before windowing
        (as word2vec and gensim do, so a window spans over them)."""
        idx = self.index
        ids, sid = [], []
        for k, s in enumerate(sentences):
            row = [idx[w] for w in s if w in idx]
            ids.extend(row)
            sid.extend([k] * len(row))
        return np.asarray(ids, dtype=np.int64), np.asarray(sid, dtype=np.int64)

    def keep_prob(self, sample: float) -> np.ndarray:
        """P(keep word w) = (sqrt(f/t) + 1) * t/f, t = sample * total, capped at 1 (gensim's
        formula; sample <= 0 keeps everything). Frequent words ("the", "and") are mostly dropped,
        which speeds training and sharpens rare-word vectors."""
        if sample <= 0:
            return np.ones(len(self), dtype=np.float64)
        t = sample * float(self.counts.sum())
        f = self.counts.astype(np.float64)
        return np.minimum(1.0, (np.sqrt(f / t) + 1.0) * t / f)

    def noise_dist(self, power: float = 0.75) -> np.ndarray:
        p = self.counts.astype(np.float64) ** power
        return p / p.sum()

    def negative_table(self, size: int = 1_000_000, power: float = 0.75) -> np.ndarray:
        """word2vec's table: word w fills round(size * count^0.75 / sum count^0.75) slots, so a
        uniform draw from the table is a draw from the smoothed unigram distribution."""
        slots = np.maximum(1, np.rint(self.noise_dist(power) * size)).astype(np.int64)
        return np.repeat(np.arange(len(self), dtype=np.int32), slots)
