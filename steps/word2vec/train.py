"""The PyTorch trainer: epochs of subsampled, dynamically windowed examples in batches of windows.

Two update paths, equal up to float rounding (tests/test_word2vec.py checks it):
- `autograd`: loss.backward() gives sparse embedding gradients, any torch optimizer steps them
  (SGD, SparseAdam, Adagrad — the optimizer comparison).
- `fused` SGD: the same gradient written out by hand and applied with `index_add_` (what
  word2vec.c does per pair, vectorised over a batch of windows), compiled by torch.compile.
"""

from __future__ import annotations

import gc
import itertools
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Callable, Literal, get_args

import numpy as np
import torch

from steps.config import ConfigError
from steps.word2vec.model import SGNS, targets_of
from steps.word2vec.sgd import NegativePool, make_sgd_step
from steps.word2vec.vocab import Vocab
from steps.word2vec.windows import plan_epoch

Optimizer = Literal["sgd", "momentum", "sparseadam", "adam", "adagrad"]
OPTIMIZERS = get_args(Optimizer)
MOMENTUM = 0.9  # the `momentum` cell's μ (torch.optim.SGD's heavy ball: v = μv + g, w -= lr·v)
# optimizers on dense gradients (every row, every step): adam's moments decay on every row; momentum's
# buffer moves every row touched so far, so it is dense anyway once the run has touched most rows, and
# torch's sparse buffer (v = μv + g, coalesced each step) grew with them to ~300 words/s on the plays
DENSE = ("adam", "momentum")


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """The trainer's knobs and their defaults: the only declaration (the word2vec schema's entries
    for these keys must match it: tests/test_config_knobs.py). The word2vec section's dataclass
    inherits these fields (steps/word2vec/config.py)."""

    arch: Literal["skipgram", "cbow"] = "skipgram"
    dim: int = 100
    window: int = 5
    negative: int = 5
    sample: float = 1e-3
    epochs: int = 5
    optimizer: Optimizer = "sgd"
    lr: float = 0.025
    min_lr: float = 1e-4
    schedule: Literal["linear", "constant"] = "linear"  # linear: word2vec's decay to min_lr
    batch_size: int = 512  # windows (center words) per step
    shared_negatives: bool = True  # one set of K negatives per window (False: per pair)
    fused: bool = True  # hand-written SGD step (only with optimizer sgd)
    compile: bool = True  # torch.compile the fused step
    table_size: int = 1_000_000
    chunk_words: int = 4_000_000  # tokens whose examples are built at once
    log_every: int = 50  # steps between loss points: each the logged step's batch loss (before its update)

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
            raise ConfigError(
                "word2vec: fused=true is the hand-written SGD step; use optimizer sgd or set fused: false"
            )
        if not self.lr > 0:
            raise ConfigError(f"word2vec: lr must be > 0, got {self.lr}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig(TrainOptions):
    """One training run: the knobs and its seed."""

    seed: int = 0

    @classmethod
    def from_params(cls, params, **extra) -> "TrainConfig":
        """The run a word2vec section (its dict or its dataclass; other keys ignored) asks for."""
        section = params if isinstance(params, dict) else vars(params)
        names = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in {**section, **extra}.items() if k in names})
        cfg.check()
        return cfg


def make_optimizer(model: SGNS, cfg: TrainConfig):
    """The update rules side by side (docs/word2vec.md "Optimizers"), g the batch's gradient:
    sgd        w -= lr·g                          (the rows in the batch)
    momentum   v = μv + g; w -= lr·v              (v of every row the run has touched: it keeps moving
                                                   rows that left the batch; torch's buffer is sparse)
    adagrad    s += g²; w -= lr·g/(√s + ε)        (the rows in the batch)
    sparseadam m, v moments of the rows in the batch only (lazy Adam; bias-corrected per step)
    adam       m, v moments of every row, every step (dense gradients: zeros decay the moments)"""
    params = list(model.parameters())
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    if cfg.optimizer == "momentum":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=MOMENTUM)
    if cfg.optimizer == "sparseadam":
        return torch.optim.SparseAdam(params, lr=cfg.lr)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr)
    return torch.optim.Adagrad(params, lr=cfg.lr)


def chunk_bounds(sid: np.ndarray, chunk_words: int) -> list[tuple[int, int]]:
    """Token ranges of about chunk_words, cut at sentence starts (no window crosses a cut), so
    an epoch's examples never have to be in memory all at once."""
    starts = np.flatnonzero(np.diff(sid, prepend=-1))
    cuts = [0]
    for pos in starts:
        if pos - cuts[-1] >= chunk_words:
            cuts.append(int(pos))
    return list(zip(cuts, cuts[1:] + [len(sid)]))


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for a loop of steps (its previous state restored
    after). A step's temporaries hold no cycles, so reference counting frees them anyway; but
    every few hundred allocations the collector ran, and its full passes walked the many
    objects torch.compile keeps alive: ~9 % of a per-pair training loop's samples (perf)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Trainer:
    """One model and its update path, ready to train token ranges. The setup (model, negative
    table, the compiled step and its warm-up on empty windows) happens once, here; its time is
    `compile_s` (Inductor caches the kernels on disk), never counted in words/s."""

    def __init__(self, vocab: Vocab, cfg: TrainConfig, device="cpu"):
        cfg.check()
        self.cfg, self.device = cfg, torch.device(device)
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        # rows on cache lines for the compiled step; contiguous for autograd's sparse adds (model.py)
        self.model = SGNS(len(vocab), cfg.dim, sparse=cfg.optimizer not in DENSE, aligned=cfg.fused).to(self.device)
        self.keep = vocab.keep_prob(cfg.sample)
        self.negatives = NegativePool(vocab.negative_table(cfg.table_size), self.rng, self.device)
        self.cbow = cfg.arch == "cbow"
        self.step_fn = make_sgd_step(cfg.compile, cfg.window) if cfg.fused else None
        self.opt = None if cfg.fused else make_optimizer(self.model, cfg)
        self.lr = torch.tensor(cfg.lr, device=self.device)
        self.acc = torch.zeros(2, device=self.device, dtype=torch.float64)  # (loss, pairs) of logged steps
        self.steps = self.examples = 0
        t0 = time.perf_counter()
        if self.step_fn is not None and cfg.compile:
            self._warm_up()
        self.compile_s = time.perf_counter() - t0

    def rows(self, width: int) -> int:
        """Target rows per window: shared negatives (or CBOW's one input) vs one draw per pair."""
        return 1 if self.cbow or self.cfg.shared_negatives else width

    def logs(self, step: int) -> bool:
        """Whether step `step` (1-based) logs a loss point: the steps that compute the loss."""
        return step % self.cfg.log_every == 0

    def step(self, ctx, mask, center, with_loss: bool = True) -> None:
        """One step; with `with_loss`, its batch's loss (before the update) and pairs go to `acc`."""
        cfg, model = self.cfg, self.model
        negs = self.negatives.take((len(center), self.rows(ctx.shape[1]), cfg.negative))
        if self.step_fn is not None:
            args = (model.inp.data, model.out.data, ctx, mask, center, negs, self.lr, self.cbow, self.acc)
            self.step_fn(*args, with_loss)
            return
        for group in self.opt.param_groups:
            group["lr"] = float(self.lr)
        self.opt.zero_grad(set_to_none=True)
        loss = model(ctx, mask, targets_of(center, negs), self.cbow)
        loss.backward()
        self.opt.step()
        if with_loss:
            pairs = (mask.any(1) if self.cbow else mask).sum()
            self.acc.add_(torch.stack([loss.detach().double(), pairs.double()]))

    def _warm_up(self) -> None:
        """Compile each window size's two graphs (with and without the loss) on empty windows (a no-op update)."""
        cfg, dev = self.cfg, self.device
        center = torch.zeros(cfg.batch_size, dtype=torch.int64, device=dev)
        for w, with_loss in itertools.product(range(1, cfg.window + 1), (False, True)):
            ctx = torch.zeros(cfg.batch_size, 2 * w, dtype=torch.int64, device=dev)
            negs = torch.zeros(cfg.batch_size, self.rows(2 * w), cfg.negative, dtype=torch.int64, device=dev)
            args = (self.model.inp.data, self.model.out.data, ctx, ctx > 0, center, negs, self.lr, self.cbow, self.acc)
            try:
                self.step_fn(*args, with_loss)
            except Exception as exc:  # no C++ compiler, unsupported platform, ...
                raise ConfigError(
                    f"word2vec: torch.compile of the SGD step failed "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                    f"fix: install a C++ compiler (g++) or set word2vec.compile: false"
                ) from exc
        self.acc.zero_()

    def train_range(self, ids: np.ndarray, sid: np.ndarray, rate: Callable[[int, int], float], after=None) -> None:
        """One pass over a token range: plan it (subsampling, windows; numpy, timed as part of
        training, as gensim's own is), then step through its batches. With the linear schedule
        `rate(i, n)` is the learning rate at batch i of n; `after(i, n)` runs after each step."""
        cfg = self.cfg
        plan = plan_epoch(ids, sid, self.keep, cfg.window, cfg.batch_size, self.rng, self.device)
        self.examples += plan.windows if self.cbow else plan.pairs
        n = len(plan.batches)
        with gc_paused():
            for i, batch in enumerate(plan.batches, 1):
                if cfg.schedule == "linear":
                    self.lr.fill_(rate(i, n))
                self.step(*batch, with_loss=self.logs(self.steps + 1))
                self.steps += 1
                if after is not None:
                    after(i, n)

    def vectors(self) -> np.ndarray:
        return self.model.inp.detach().cpu().numpy().astype(np.float32)


def train(
    vocab: Vocab,
    ids: np.ndarray,
    sid: np.ndarray,
    raw_words: int,
    cfg: TrainConfig,
    device="cpu",
    progress=None,
    log=None,
) -> tuple[np.ndarray, dict]:
    """Train and return (input vectors as float32 numpy, stats). `raw_words` = corpus tokens per
    epoch including out-of-vocabulary ones: words/s counts them, as gensim's raw word count does.
    `progress(total=...)` makes a tqdm-like bar; `log(metrics, step)` receives the loss.
    The timer starts after the compile warm-up (reported as compile_s)."""
    trainer = Trainer(vocab, cfg, device)
    acc, lr = trainer.acc, trainer.lr
    bounds = chunk_bounds(sid, cfg.chunk_words)
    total = raw_words * cfg.epochs
    bar = progress(total=total, unit="w", unit_scale=True, desc="word2vec") if progress else None
    losses, last = [], [(0.0, 0.0)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for epoch in range(cfg.epochs):
        for a, z in bounds:
            chunk_raw, done = raw_words * (z - a) / len(ids), [0]

            def frac(i, n):  # share of the whole training done after batch i of this chunk's n
                return (epoch + (a + (z - a) * i / n) / len(ids)) / cfg.epochs

            def rate(i, n):  # word2vec: decay linearly with words processed
                return max(cfg.min_lr, cfg.lr - (cfg.lr - cfg.min_lr) * frac(i, n))

            def after(i, n):
                if trainer.logs(trainer.steps):  # this step's batch: its mean loss per pair
                    now = acc.tolist()
                    losses.append((now[0] - last[0][0]) / max(now[1] - last[0][1], 1.0))
                    last[0] = now
                    if log:
                        log({"loss": losses[-1], "lr": float(lr), "epoch": frac(i, n) * cfg.epochs}, trainer.steps)
                if bar is not None:
                    words = int(chunk_raw * i / n) - done[0]
                    bar.update(words)
                    done[0] += words

            trainer.train_range(ids[a:z], sid[a:z], rate, after)
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if bar is not None:
        bar.close()
    pairs = float(trainer.examples)
    stats = {
        "train_seconds": seconds,
        "words_per_s": total / seconds,
        "train_cpu_s": cpu,
        "words_per_cpu_s": total / cpu,
        "compile_s": trainer.compile_s,
        "steps": trainer.steps,
        "examples": pairs,
        "examples_per_s": pairs / seconds,
        "loss_first": losses[0] if losses else float("nan"),
        "loss_final": losses[-1] if losses else float("nan"),
    }
    return trainer.vectors(), stats
