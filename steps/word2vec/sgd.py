"""The hand-written SGD step (word2vec's update, vectorised over a batch of windows and compiled)
and the pool of negative draws it consumes."""

from __future__ import annotations

import numpy as np
import torch

from steps.word2vec.model import pair_weights, pool, scores, sgns_loss, targets_of


def sgd_step(inp, out, ctx, mask, center, negatives, lr, cbow: bool, acc, with_loss: bool = True):
    """One SGD step on a batch of windows without autograd; with `with_loss`, adds (loss, pairs) of
    the batch, before the step, to `acc` (a tensor: no host sync per step). The trainer asks for
    the loss only on the steps it logs: its log-sigmoid (an exp and a log1p per row) was ~10 % of
    a per-pair step's samples (perf), and gensim's default (compute_loss=False) computes none.

    With s = h·v, d loss/d s = σ(s) - label, so with g = lr·(label - σ(s))·weight:
    v += g h and h += Σ g v (both from the old values, as word2vec.c), scattered with
    index_add_. Pure tensor ops, so torch.compile turns it into one loop nest per window size
    (gather, dot products, sigmoid, scatter). Compiled, v is gathered once per use: with one
    gather, Inductor copied the gathered rows (B, J, 1 + K, d) to a buffer before the update
    (12 MB a step per pair at w = 5), so that dh could read the old rows; gathered again, each
    loop reads the rows from the table, and make_sgd_step keeps the dh loop ahead of the out
    update (tests/test_word2vec.py checks the generated code has neither copy)."""
    targets = targets_of(center, negatives)
    h = inp[ctx]
    share = None
    if cbow:
        h, share = pool(h, mask)
    v = out[targets]  # (B, J, 1 + K, d)
    s = scores(h, v)
    weight = pair_weights(mask, targets, share)
    label = torch.zeros(s.shape[-1], dtype=s.dtype, device=s.device)
    label[0] = 1
    g = (label - torch.sigmoid(s)) * weight * lr
    if torch.compiler.is_compiling():  # gather again, not a copy of the rows (docstring)
        v = out[targets]
    dh = (g.unsqueeze(-1) * v).sum(2)  # (B, rows, d)
    dv = g.unsqueeze(-1) * h.unsqueeze(2)  # (B, rows, 1 + K, d)
    if targets.shape[1] != dv.shape[1]:  # shared negatives: sum the rows
        dv = dv.sum(1, keepdim=True)
    if share is not None:  # CBOW: each member its share
        dh = dh * share.unsqueeze(2)
    d = inp.shape[1]
    out.index_add_(0, targets.reshape(-1), dv.reshape(-1, d))
    inp.index_add_(0, ctx.reshape(-1), dh.reshape(-1, d))
    if with_loss:
        acc.add_(torch.stack([sgns_loss(s, weight), weight[..., 0].sum()]))


COMPILE_OPTIONS = {"assert_indirect_indexing": False, "reorder_for_locality": False}  # make_sgd_step's


def make_sgd_step(compile_: bool, window: int = 5):
    """The SGD step, compiled with static shapes (a graph per window size b, with and without the loss) or eager.
    Indirect-index bounds asserts are dropped from the generated loops: gather_windows clamps
    every position and the vocabulary ids come from our own tables. reorder_for_locality off:
    that pass moved dh's gather of the old output rows after the out update (next to dh's use),
    so out could not be updated in place and Inductor cloned the whole table twice a step."""
    step = torch.no_grad()(sgd_step)
    if not compile_:
        return step
    dynamo = torch._dynamo.config  # a graph per b and loss or not, per-pair variants, tests: room for all
    dynamo.recompile_limit = max(dynamo.recompile_limit, 8 * window + 8)
    return torch.compile(step, dynamic=False, options=COMPILE_OPTIONS)


class NegativePool:
    """Negative words drawn from the unigram^0.75 table in blocks of ~1 M with numpy and handed
    out as views: one torch.randint + gather per step cost as much as a third of the step.

    The table is kept in the narrowest integer type that holds every word id (uint16 up to 65,536
    words: 2 MB for the default 1 M slots, which stays in a 2 MiB L2 beside the step's rows; int64
    was 8 MB): each draw reads one random slot, so the table's bytes decide how many draws miss the
    cache. The ids come out as int64 (what torch indexes with); the draws are the same either way.
    Interleaved on the plays' vocabulary (8,658 words), 5 M draws a side: 1.25x [1.16, 1.34] the
    int64 table's speed (20 pairs; 2-core Xeon with AMX, L2 2 MiB, under load)."""

    def __init__(self, table: np.ndarray, rng: np.random.Generator, device, block: int = 1 << 20):
        narrow = np.min_scalar_type(int(table.max(initial=0)))
        self.table = table.astype(narrow if narrow.kind == "u" else np.int64)
        self.rng, self.device, self.block = rng, device, block
        self.buf, self.pos = torch.empty(0, dtype=torch.int64), 0

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        n = int(np.prod(shape))
        if self.pos + n > len(self.buf):
            draws = np.take(self.table, self.rng.integers(0, len(self.table), max(self.block, n)))
            self.buf, self.pos = torch.from_numpy(draws.astype(np.int64)).to(self.device), 0
        self.pos += n
        return self.buf[self.pos - n : self.pos].view(shape)
