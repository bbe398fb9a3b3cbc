"""The PyTorch trainer: epochs of subsampled, dynamically windowed examples in large batches.

Two update paths, equal up to float rounding (tests/test_word2vec.py checks it):
- `autograd`: loss.backward() gives sparse embedding gradients, any torch optimizer steps them
  (SGD, SparseAdam, Adagrad — the optimizer comparison).
- `fused` SGD: the same gradient written out by hand and applied with `index_add_`, skipping the
  sparse-tensor bookkeeping; this is what word2vec.c does per pair, vectorised over a batch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F

from steps.config import ConfigError
from steps.w2v.model import SGNS, sgns_loss
from steps.w2v.pairs import cbow_examples, skipgram_examples, subsample
from steps.w2v.vocab import Vocab

OPTIMIZERS = ("sgd", "sparseadam", "adagrad")


@dataclass
class TrainConfig:
    arch: str = "skipgram"         # skipgram | cbow
    dim: int = 100
    window: int = 5
    negative: int = 5
    sample: float = 1e-3
    epochs: int = 5
    optimizer: str = "sgd"         # sgd | sparseadam | adagrad
    lr: float = 0.025
    min_lr: float = 1e-4
    schedule: str = "linear"       # linear (word2vec's decay to min_lr) | constant
    batch_size: int = 512          # skip-gram pairs (or CBOW centers) per step
    fused: bool = True             # hand-written SGD step (only with optimizer sgd)
    table_size: int = 1_000_000
    chunk_words: int = 4_000_000   # tokens whose examples are built at once
    log_every: int = 50
    seed: int = 0

    @classmethod
    def from_params(cls, params: dict, **extra) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in {**params, **extra}.items() if k in names})
        cfg.check()
        return cfg

    def check(self) -> None:
        """The code-path guard behind the schema minimums (a hand-made config meets it too);
        ConfigError is a ValueError that the stage reports as one line, without a traceback."""
        for key in ("dim", "window", "negative", "epochs", "batch_size", "table_size", "chunk_words"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"word2vec: {key} must be >= 1, got {getattr(self, key)}")
        if self.arch not in ("skipgram", "cbow"):
            raise ConfigError(f"word2vec: arch must be skipgram or cbow, got {self.arch!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"word2vec: optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.fused and self.optimizer != "sgd":
            raise ConfigError("word2vec: fused=true is the hand-written SGD step; use optimizer sgd "
                             "or set fused: false")
        if not self.lr > 0:
            raise ConfigError(f"word2vec: lr must be > 0, got {self.lr}")


def make_optimizer(model: SGNS, cfg: TrainConfig):
    params = list(model.parameters())
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    if cfg.optimizer == "sparseadam":
        return torch.optim.SparseAdam(params, lr=cfg.lr)
    return torch.optim.Adagrad(params, lr=cfg.lr)


@torch.no_grad()
def fused_sgd_step(model: SGNS, inputs, targets, lr: float, offsets=None, with_loss=True):
    """One SGD step on the summed SGNS loss without autograd; returns the loss before the step
    (None unless `with_loss`: computing it every step costs ~10% of the step).

    With s = h·v, d loss/d s = σ(s) - label, so with g = lr·(label - σ(s)):
    v_k += g_k h and h += Σ_k g_k v_k (old v, as word2vec.c), scattered with index_add_.
    Multiply-and-sum beats bmm for these (B, 1+K, d) shapes, and batches of a few hundred
    pairs keep the gathered rows in cache (see the batch_size default)."""
    inp, out = model.inp, model.out
    if offsets is None:
        h = inp.index_select(0, inputs)
    else:
        h = F.embedding_bag(inputs, inp, offsets, mode="mean")
    B, K1 = targets.shape
    flat = targets.reshape(-1)
    v = out.index_select(0, flat).view(B, K1, -1)
    s = (v * h.unsqueeze(1)).sum(-1)
    loss = sgns_loss(s) if with_loss else None
    g = torch.sigmoid(s).neg_()
    g[:, 0] += 1.0
    g.mul_(lr)
    gh = (g.unsqueeze(2) * v).sum(1)
    out.index_add_(0, flat, (g.unsqueeze(2) * h.unsqueeze(1)).view(B * K1, -1))
    if offsets is None:
        inp.index_add_(0, inputs, gh)
    else:  # mean of a bag: each member gets gh / bag size
        counts = torch.diff(offsets, append=offsets.new_tensor([len(inputs)]))
        share = (gh / counts.unsqueeze(1).to(gh.dtype)).repeat_interleave(counts, 0)
        inp.index_add_(0, inputs, share)
    return loss


class Batches:
    """One epoch of examples as torch tensors, sliced into batches (skip-gram pairs or CBOW bags).

    Each batch comes with its targets matrix (true word, then `negative` draws from the table);
    negatives are drawn for many batches at once to keep per-step Python overhead small."""
    BLOCK = 1 << 18

    def __init__(self, cfg: TrainConfig, ids, sid, keep, table, rng, gen, device):
        ids, sid = subsample(ids, sid, keep, rng)
        self.cbow = cfg.arch == "cbow"
        if self.cbow:
            c, x, off = cbow_examples(ids, sid, cfg.window, rng)
            self.offsets = torch.from_numpy(np.append(off, len(x))).to(device)
        else:
            c, x = skipgram_examples(ids, sid, cfg.window, rng)
        self.target = torch.from_numpy(c if self.cbow else x).to(device)
        self.inputs = torch.from_numpy(x if self.cbow else c).to(device)
        self.n, self.bs, self.k = len(self.target), cfg.batch_size, cfg.negative
        self.table, self.gen = table, gen

    def __len__(self) -> int:
        return (self.n + self.bs - 1) // self.bs

    def __iter__(self):
        block = max(self.BLOCK // self.bs, 1) * self.bs
        for b0 in range(0, self.n, block):
            b1 = min(b0 + block, self.n)
            draws = torch.randint(len(self.table), (b1 - b0, self.k), generator=self.gen,
                                  device=self.table.device)
            targets = torch.cat([self.target[b0:b1, None], self.table[draws]], 1)
            for s in range(b0, b1, self.bs):
                e = min(s + self.bs, b1)
                if self.cbow:
                    a, z = self.offsets[s], self.offsets[e]
                    yield self.inputs[a:z], targets[s - b0:e - b0], self.offsets[s:e] - a, e
                else:
                    yield self.inputs[s:e], targets[s - b0:e - b0], None, e


def chunk_bounds(sid: np.ndarray, chunk_words: int) -> list[tuple[int, int]]:
    """Token ranges of about chunk_words, cut at sentence starts (no window crosses a cut), so
    an epoch's examples never have to be in memory all at once."""
    starts = np.flatnonzero(np.diff(sid, prepend=-1))
    cuts = [0]
    for pos in starts:
        if pos - cuts[-1] >= chunk_words:
            cuts.append(int(pos))
    return list(zip(cuts, cuts[1:] + [len(sid)]))


def train(vocab: Vocab, ids: np.ndarray, sid: np.ndarray, raw_words: int, cfg: TrainConfig,
          device="cpu", progress=None, log=None) -> tuple[np.ndarray, dict]:
    """Train and return (input vectors as float32 numpy, stats). `raw_words` = corpus tokens per
    epoch including out-of-vocabulary ones: words/s counts them, as gensim's raw word count does.
    `progress(total=...)` makes a tqdm-like bar; `log(metrics, step)` receives the loss."""
    cfg.check()
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    model = SGNS(len(vocab), cfg.dim).to(device)
    opt = None if cfg.fused else make_optimizer(model, cfg)
    keep = vocab.keep_prob(cfg.sample)
    table = torch.from_numpy(vocab.negative_table(cfg.table_size)).long().to(device)
    total = raw_words * cfg.epochs
    bar = progress(total=total, unit="w", unit_scale=True, desc="word2vec") if progress else None
    step, examples, lr, losses = 0, 0, cfg.lr, []
    bounds = chunk_bounds(sid, cfg.chunk_words)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for epoch in range(cfg.epochs):
        for a, z in bounds:
            batches = Batches(cfg, ids[a:z], sid[a:z], keep, table, rng, gen, device)
            chunk_raw, done = raw_words * (z - a) / len(ids), 0
            for inputs, targets, offsets, end in batches:
                frac = (epoch + (a + (z - a) * end / batches.n) / len(ids)) / cfg.epochs
                if cfg.schedule == "linear":  # word2vec: decay linearly with words processed
                    lr = max(cfg.min_lr, cfg.lr - (cfg.lr - cfg.min_lr) * frac)
                step += 1
                logging = step % cfg.log_every == 0
                if cfg.fused:
                    loss = fused_sgd_step(model, inputs, targets, lr, offsets, with_loss=logging)
                else:
                    for group in opt.param_groups:
                        group["lr"] = lr
                    opt.zero_grad(set_to_none=True)
                    loss = model(inputs, targets, offsets)
                    loss.backward()
                    opt.step()
                examples += len(targets)
                if logging:  # the loss of every log_every-th batch, per example
                    losses.append(float(loss.detach()) / len(targets))
                    if log:
                        log({"loss": losses[-1], "lr": lr, "epoch": frac * cfg.epochs}, step)
                if bar is not None:
                    words = int(chunk_raw * end / batches.n) - done
                    bar.update(words)
                    done += words
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if bar is not None:
        bar.close()
    stats = {"train_seconds": seconds, "words_per_s": total / seconds, "train_cpu_s": cpu,
             "words_per_cpu_s": total / cpu, "steps": step,
             "examples": examples, "examples_per_s": examples / seconds,
             "loss_first": losses[0] if losses else float("nan"),
             "loss_final": losses[-1] if losses else float("nan")}
    return model.inp.detach().cpu().numpy().astype(np.float32), stats
