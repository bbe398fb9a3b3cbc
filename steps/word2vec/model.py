"""Skip-gram / CBOW with negative sampling over whole windows: two embedding tables, the loss,
and the pieces the hand-written SGD step (train.py) shares with it.

Shapes of one batch of B windows of 2w slots, K negatives:
- contexts (B, 2w) word ids with a mask (slots outside the sentence are off);
- targets (B, J, 1 + K): the center word, then K negatives. J = 1 shares the negatives among
  the window's pairs (pWord2Vec, Ji et al. 2016: fewer rows to gather, the same expected
  gradient); J = 2w draws them per pair, as word2vec.c does.
- skip-gram: each context row h predicts the center (gensim's orientation: syn0[context] is the
  input); CBOW: the mean of the context rows predicts it (one input row per window).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class SGNS(nn.Module):
    """`inp` holds the word vectors we keep; `out` the context ("syn1neg") vectors.

    Initialised like gensim 4 (`prep_vectors`): inp ~ U(-1/d, 1/d), out = 0 (word2vec.c draws
    inp from half that range; matching the baseline moved our analogy score 0.4 points closer
    to gensim's on the plays). Both lookups are sparse, so a step touches only the rows in the
    batch (and SparseAdam / sparse Adagrad can be used); `sparse=False` gives dense gradients
    (every row, zeros included: what dense Adam needs). `aligned` puts each table's rows on cache
    lines (`row_aligned`: for the compiled SGD step, which reads rows by id); the autograd path keeps
    them contiguous, since torch adds a sparse gradient into a strided table one row at a time (a
    select and an add_ per row; scripts/w2v-autograd-layout, docs/benchmarks/*-w2v-autograd-layout.md)."""

    def __init__(self, vocab_size: int, dim: int, sparse: bool = True, aligned: bool = True):
        super().__init__()
        if vocab_size < 1 or dim < 1:
            raise ValueError(f"vocab_size and dim must be >= 1, got {vocab_size}, {dim}")
        layout = row_aligned if aligned else (lambda table: table)
        self.inp = nn.Parameter(layout(torch.empty(vocab_size, dim).uniform_(-1.0 / dim, 1.0 / dim)))
        self.out = nn.Parameter(layout(torch.zeros(vocab_size, dim)))
        self.sparse = sparse

    def forward(self, contexts, mask, targets, cbow: bool = False):
        """Summed loss -log σ(h·v_center) - Σ_k log σ(-h·v_k) over the valid pairs of the batch
        (the sum, not the mean, keeps SGD's learning rate per pair, as in word2vec)."""
        h = F.embedding(contexts, self.inp, sparse=self.sparse)
        share = None
        if cbow:
            h, share = pool(h, mask)
        v = F.embedding(targets, self.out, sparse=self.sparse)
        return sgns_loss(scores(h, v), pair_weights(mask, targets, share))


def cache_line_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size") -> int:
    """The L1 data cache's line size as the kernel reports it (64 bytes where it does not)."""
    try:
        return int(Path(sysfs).read_text()) or 64
    except (OSError, ValueError):
        return 64


def row_aligned(table: torch.Tensor) -> torch.Tensor:
    """`table` (V, d) copied into a buffer whose rows start on cache lines: a view of its first d
    columns, row stride d rounded up to a line (d = 100 float32: 112). Every access of a step is a
    row by id; at 400 bytes a row, 3 rows in 4 start inside a line, so each 16-lane load of theirs
    spans two lines. Only the layout changes: the padding is never read, the values are the same.
    Measured against contiguous tables by scripts/w2v-step-knobs (docs/benchmarks/*-w2v-step-knobs.md)."""
    V, d = table.shape
    per_line = max(1, cache_line_bytes() // table.element_size())
    stride = -(-d // per_line) * per_line
    if stride == d:
        return table
    buf = torch.zeros(V, stride, dtype=table.dtype, device=table.device)
    buf[:, :d] = table
    return buf[:, :d]


def targets_of(center: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """(B, J, 1 + K) target ids: the center word in column 0, then the negatives (B, J, K)."""
    B, J, _ = negatives.shape
    return torch.cat([center.view(B, 1, 1).expand(B, J, 1), negatives], 2)


def pool(h: torch.Tensor, mask: torch.Tensor):
    """CBOW's input: the mean of the window's valid rows, (B, 1, d); `share` (B, 2w) is each
    member's weight in it, which is also its share of the gradient."""
    share = mask / mask.sum(1, keepdim=True).clamp(min=1)
    return (h * share.unsqueeze(2)).sum(1, keepdim=True), share


def pair_weights(mask, targets, share=None) -> torch.Tensor:
    """(B, rows, 1 + K) 0/1 weights: the input row is a real one (a valid slot; for CBOW a
    non-empty window) and the target is not a negative that drew the center itself (word2vec.c
    and gensim skip those)."""
    rows = mask if share is None else mask.any(1, keepdim=True)
    first = torch.arange(targets.shape[-1], device=targets.device) == 0  # the center's own column
    col = (targets != targets[..., :1]) | first  # no cat: compiled, a cat is a buffer of its own
    return (rows.unsqueeze(2) & col).to(torch.float32)


def scores(h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """h (B, rows, d), v (B, J, 1 + K, d) with J = 1 or rows -> h·v (B, rows, 1 + K).
    Compiled, multiply-and-sum fuses into one loop; eager, it would materialise a
    (B, rows, 1 + K, d) product, so shared targets (J = 1) take a bmm instead."""
    if v.shape[1] == 1 and not torch.compiler.is_compiling():
        return torch.bmm(h, v[:, 0].transpose(1, 2))
    return (h.unsqueeze(2) * v).sum(-1)


def sgns_loss(s: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """s (..., 1 + K): column 0 is the positive, the rest negatives; weighted sum of -log σ(±s)."""
    sign = torch.ones(s.shape[-1], dtype=s.dtype, device=s.device)
    sign[1:] = -1
    return -(F.logsigmoid(s * sign) * weight).sum()
