"""Vectorised training-example generation: subsampling, dynamic window, skip-gram pairs and
CBOW bags, all with numpy over a whole chunk of tokens at once (no Python loop per word)."""
from __future__ import annotations

import numpy as np


def subsample(ids: np.ndarray, sid: np.ndarray, keep_prob: np.ndarray, rng: np.random.Generator):
    keep = rng.random(len(ids)) < keep_prob[ids]
    return ids[keep], sid[keep]


def window_pairs(sid: np.ndarray, window: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Positions (center, context) with |center - context| <= b[center], same sentence.

    b[center] ~ U{1..window} is word2vec's dynamic window: near words are seen more often
    (weight (window - d + 1) / window at distance d) without any explicit weighting."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    n = len(sid)
    b = rng.integers(1, window + 1, size=n)
    centers, contexts = [], []
    for d in range(1, window + 1):
        i = np.arange(n - d)
        j = i + d
        same = sid[i] == sid[j]
        fwd = same & (b[i] >= d)            # center i sees i + d
        bwd = same & (b[j] >= d)            # center j sees j - d
        centers += [i[fwd], j[bwd]]
        contexts += [j[fwd], i[bwd]]
    return np.concatenate(centers), np.concatenate(contexts)


def skipgram_examples(ids, sid, window, rng, shuffle=True):
    """(center word, context word) id pairs of one chunk, shuffled so a batch mixes positions."""
    c, x = window_pairs(sid, window, rng)
    if shuffle:
        p = rng.permutation(len(c))
        c, x = c[p], x[p]
    return ids[c], ids[x]


def cbow_examples(ids, sid, window, rng):
    """Per center word, its bag of context words: (centers, flat contexts, offsets) for
    `embedding_bag`. Kept in text order (gensim's order); centers with no context are dropped."""
    c, x = window_pairs(sid, window, rng)
    order = np.argsort(c, kind="stable")
    c, x = c[order], x[order]
    centers, counts = np.unique(c, return_counts=True)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return ids[centers], ids[x], offsets
