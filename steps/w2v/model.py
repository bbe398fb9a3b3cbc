"""Skip-gram / CBOW with negative sampling: two embedding tables, sparse gradients."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SGNS(nn.Module):
    """`inp` holds the word vectors we keep; `out` the context ("syn1neg") vectors.

    Initialised like word2vec: inp ~ U(-0.5/d, 0.5/d), out = 0. Both lookups are sparse, so a
    step touches only the rows in the batch (and SparseAdam / sparse Adagrad can be used).
    Unlike word2vec.c, a negative that happens to equal the true word is not skipped (rare for
    all but the most frequent words, which subsampling thins out)."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        if vocab_size < 1 or dim < 1:
            raise ValueError(f"vocab_size and dim must be >= 1, got {vocab_size}, {dim}")
        self.inp = nn.Parameter(torch.empty(vocab_size, dim).uniform_(-0.5 / dim, 0.5 / dim))
        self.out = nn.Parameter(torch.zeros(vocab_size, dim))

    def forward(self, inputs, targets, offsets=None):
        """Summed loss -log σ(h·v_t0) - Σ_k log σ(-h·v_tk) over the batch.

        targets (B, 1 + K): column 0 the true word, then K negatives.
        Skip-gram: inputs = center ids (B,), targets[:, 0] = context ids.
        CBOW: inputs = flat context ids with `offsets` (B bags, averaged), targets[:, 0] = centers.
        The sum (not mean) keeps SGD's learning rate per example, as in word2vec."""
        if offsets is None:
            h = F.embedding(inputs, self.inp, sparse=True)
        else:
            h = F.embedding_bag(inputs, self.inp, offsets, mode="mean", sparse=True)
        v = F.embedding(targets, self.out, sparse=True)                   # (B, 1 + K, d)
        return sgns_loss((v * h.unsqueeze(1)).sum(-1))


def sgns_loss(scores: torch.Tensor) -> torch.Tensor:
    """scores (B, 1 + K) = h·v: column 0 is the positive, the rest negatives."""
    return -(F.logsigmoid(scores[:, 0]).sum() + F.logsigmoid(-scores[:, 1:]).sum())
