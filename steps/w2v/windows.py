"""Training examples as whole windows: one center word with its (dynamic) window of context words.

word2vec.c walks the text: per kept word it draws a window b ~ U{1..window} and trains every
(context -> center) pair in it. Here an epoch is planned in numpy (subsampling, b, centers
grouped by b, in text order) and each batch is only a vector of center positions; the (B, 2b) context
matrix is gathered from the token array by `gather_windows` in torch, inside the (compiled)
training step, so no pair list is ever materialised. Grouping by b keeps shapes static (one
compiled graph per b) and wastes no work on padding except at sentence edges.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def subsample(ids: np.ndarray, sid: np.ndarray, keep_prob: np.ndarray, rng: np.random.Generator):
    keep = rng.random(len(ids)) < keep_prob[ids]
    return ids[keep], sid[keep]


@dataclass
class EpochPlan:
    """One chunk of one epoch: padded token/sentence arrays and batches of center positions.

    Padding slots have sentence id -1: a window never reaches into them, and a batch is
    topped up with a padding position as center, whose window is empty (zero update)."""
    tokens: torch.Tensor          # (capacity,) int64 word ids of the kept tokens, then padding
    sentence: torch.Tensor        # (capacity,) int64 sentence ids, -1 on padding
    batches: list[tuple[int, torch.Tensor]]   # (b, center positions (batch,)) in training order
    kept: int                     # tokens left after subsampling


def plan_epoch(ids, sid, keep_prob, window: int, batch: int, capacity: int,
               rng: np.random.Generator) -> EpochPlan:
    """Subsample, draw each center's b, group the centers by b and cut each group into equal
    batches; batches run in text order (by their first center), as gensim walks the text.
    Measured on the plays: text order is faster than shuffled batches (neighbouring windows
    share rows in cache) and keeps analogy/SimLex scores closer to gensim's."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    x, s = subsample(ids, sid, keep_prob, rng)
    n = len(x)
    if capacity <= n:
        raise ValueError(f"capacity {capacity} must exceed the chunk's {n} tokens (one pad slot)")
    b = rng.integers(1, window + 1, size=n)
    order = np.argsort(b, kind="stable")              # grouped by b, text order within a group
    bounds = np.concatenate([[0], np.cumsum(np.bincount(b, minlength=window + 1)[1:])])
    sizes, chunks = [], []
    for w in range(1, window + 1):
        group = order[bounds[w - 1]:bounds[w]]
        group = np.concatenate([group, np.full(-len(group) % batch, n)])   # pad: empty windows
        chunks.append(group.reshape(-1, batch))
        sizes += [w] * len(chunks[-1])
    chunks = np.concatenate(chunks) if chunks else np.zeros((0, batch), dtype=np.int64)
    first = np.argsort(chunks[:, 0], kind="stable")
    batches = [(sizes[i], torch.from_numpy(chunks[i])) for i in first]
    tokens = torch.zeros(capacity, dtype=torch.int64)
    sentence = torch.full((capacity,), -1, dtype=torch.int64)
    tokens[:n], sentence[:n] = torch.from_numpy(x), torch.from_numpy(s)
    return EpochPlan(tokens, sentence, batches, n)


def gather_windows(tokens: torch.Tensor, sentence: torch.Tensor, centers: torch.Tensor, w: int):
    """Context ids (B, 2w), their mask (same sentence, inside the array) and center ids (B,).

    Column j of the window is offset -w..-1, 1..w; masked slots hold a real id but must get
    zero weight. Pure tensor ops, so it fuses into the compiled step."""
    offsets = torch.cat([torch.arange(-w, 0, device=centers.device),
                         torch.arange(1, w + 1, device=centers.device)])
    pos = centers.unsqueeze(1) + offsets
    cap = tokens.shape[0]
    clamped = pos.clamp(0, cap - 1)
    own = sentence[centers].unsqueeze(1)
    mask = (pos >= 0) & (pos < cap) & (sentence[clamped] == own) & (own >= 0)
    return tokens[clamped], mask, tokens[centers]
