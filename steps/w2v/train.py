"""The PyTorch trainer: epochs of subsampled, dynamically windowed examples in batches of windows.

Two update paths, equal up to float rounding (tests/test_word2vec.py checks it):
- `autograd`: loss.backward() gives sparse embedding gradients, any torch optimizer steps them
  (SGD, SparseAdam, Adagrad — the optimizer comparison).
- `fused` SGD: the same gradient written out by hand and applied with `index_add_` (what
  word2vec.c does per pair, vectorised over a batch of windows), compiled by torch.compile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np
import torch

from steps.config import ConfigError
from steps.w2v.model import SGNS, pair_weights, pool, scores, sgns_loss, targets_of
from steps.w2v.vocab import Vocab
from steps.w2v.windows import plan_epoch

OPTIMIZERS = ("sgd", "sparseadam", "adagrad")


@dataclass
class TrainConfig:
    arch: str = "skipgram"  # skipgram | cbow
    dim: int = 100
    window: int = 5
    negative: int = 5
    sample: float = 1e-3
    epochs: int = 5
    optimizer: str = "sgd"  # sgd | sparseadam | adagrad
    lr: float = 0.025
    min_lr: float = 1e-4
    schedule: str = "linear"  # linear (word2vec's decay to min_lr) | constant
    batch_size: int = 512  # windows (center words) per step
    shared_negatives: bool = True  # one set of K negatives per window (False: per pair)
    fused: bool = True  # hand-written SGD step (only with optimizer sgd)
    compile: bool = True  # torch.compile the fused step
    table_size: int = 1_000_000
    chunk_words: int = 4_000_000  # tokens whose examples are built at once
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
            raise ConfigError(
                "word2vec: fused=true is the hand-written SGD step; use optimizer sgd or set fused: false"
            )
        if not self.lr > 0:
            raise ConfigError(f"word2vec: lr must be > 0, got {self.lr}")


def make_optimizer(model: SGNS, cfg: TrainConfig):
    params = list(model.parameters())
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    if cfg.optimizer == "sparseadam":
        return torch.optim.SparseAdam(params, lr=cfg.lr)
    return torch.optim.Adagrad(params, lr=cfg.lr)


def sgd_step(inp, out, ctx, mask, center, negatives, lr, cbow: bool, acc):
    """One SGD step on a batch of windows without autograd; adds (loss, pairs) of the batch,
    before the step, to `acc` (a tensor: no host sync per step).

    With s = h·v, d loss/d s = σ(s) - label, so with g = lr·(label - σ(s))·weight:
    v += g h and h += Σ g v (both from the old values, as word2vec.c), scattered with
    index_add_. Pure tensor ops, so torch.compile turns it into one loop nest per window size
    (gather, dot products, sigmoid, scatter) with no (B, 2w, 1 + K, d) temporaries."""
    targets = targets_of(center, negatives)
    h = inp[ctx]
    share = None
    if cbow:
        h, share = pool(h, mask)
    v = out[targets]
    s = scores(h, v)
    weight = pair_weights(mask, targets, share)
    label = torch.zeros(s.shape[-1], dtype=s.dtype, device=s.device)
    label[0] = 1
    g = (label - torch.sigmoid(s)) * weight * lr
    dh = (g.unsqueeze(-1) * v).sum(2)  # (B, rows, d)
    dv = g.unsqueeze(-1) * h.unsqueeze(2)  # (B, rows, 1 + K, d)
    if targets.shape[1] != dv.shape[1]:  # shared negatives: sum the rows
        dv = dv.sum(1, keepdim=True)
    if share is not None:  # CBOW: each member its share
        dh = dh * share.unsqueeze(2)
    d = inp.shape[1]
    out.index_add_(0, targets.reshape(-1), dv.reshape(-1, d))
    inp.index_add_(0, ctx.reshape(-1), dh.reshape(-1, d))
    acc.add_(torch.stack([sgns_loss(s, weight), weight[..., 0].sum()]))


def make_sgd_step(compile_: bool, window: int = 5):
    """The SGD step, compiled with static shapes (one graph per window size b) or eager.
    Indirect-index bounds asserts are dropped from the generated loops: gather_windows clamps
    every position and the vocabulary ids come from our own tables."""
    step = torch.no_grad()(sgd_step)
    if not compile_:
        return step
    dynamo = torch._dynamo.config  # one graph per b, per-pair variants and tests: room for all
    dynamo.recompile_limit = max(dynamo.recompile_limit, 4 * window + 8)
    return torch.compile(step, dynamic=False, options={"assert_indirect_indexing": False})


class NegativePool:
    """Negative words drawn from the unigram^0.75 table in blocks of ~1 M with numpy and handed
    out as views: one torch.randint + gather per step cost as much as a third of the step."""

    def __init__(self, table: np.ndarray, rng: np.random.Generator, device, block: int = 1 << 20):
        self.table, self.rng, self.device, self.block = table, rng, device, block
        self.buf, self.pos = torch.empty(0, dtype=torch.int64), 0

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        n = int(np.prod(shape))
        if self.pos + n > len(self.buf):
            draws = self.table[self.rng.integers(0, len(self.table), max(self.block, n))]
            self.buf, self.pos = torch.from_numpy(draws.astype(np.int64)).to(self.device), 0
        self.pos += n
        return self.buf[self.pos - n : self.pos].view(shape)


def chunk_bounds(sid: np.ndarray, chunk_words: int) -> list[tuple[int, int]]:
    """Token ranges of about chunk_words, cut at sentence starts (no window crosses a cut), so
    an epoch's examples never have to be in memory all at once."""
    starts = np.flatnonzero(np.diff(sid, prepend=-1))
    cuts = [0]
    for pos in starts:
        if pos - cuts[-1] >= chunk_words:
            cuts.append(int(pos))
    return list(zip(cuts, cuts[1:] + [len(sid)]))


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
    cfg.check()
    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model = SGNS(len(vocab), cfg.dim).to(device)
    keep = vocab.keep_prob(cfg.sample)
    negative_pool = NegativePool(vocab.negative_table(cfg.table_size), rng, device)
    bounds = chunk_bounds(sid, cfg.chunk_words)
    cbow = cfg.arch == "cbow"
    step_fn = opt = None
    if cfg.fused:
        step_fn = make_sgd_step(cfg.compile, cfg.window)
    else:
        opt = make_optimizer(model, cfg)
    lr = torch.tensor(cfg.lr, device=device)
    acc = torch.zeros(2, device=device, dtype=torch.float64)

    def rows(width):  # target rows per window: shared (or CBOW's one input) vs per pair
        return 1 if cbow or cfg.shared_negatives else width

    def step(ctx, mask, center):
        negs = negative_pool.take((len(center), rows(ctx.shape[1]), cfg.negative))
        if step_fn is not None:
            return step_fn(model.inp.data, model.out.data, ctx, mask, center, negs, lr, cbow, acc)
        for group in opt.param_groups:
            group["lr"] = float(lr)
        targets = targets_of(center, negs)
        opt.zero_grad(set_to_none=True)
        loss = model(ctx, mask, targets, cbow)
        loss.backward()
        opt.step()
        acc.add_(torch.stack([loss.detach().double(), (mask.any(1) if cbow else mask).sum().double()]))

    t0 = time.perf_counter()
    if step_fn is not None and cfg.compile:  # warm-up: each window size on empty windows (no-op)
        center = torch.zeros(cfg.batch_size, dtype=torch.int64, device=device)
        for w in range(1, cfg.window + 1):
            ctx = torch.zeros(cfg.batch_size, 2 * w, dtype=torch.int64, device=device)
            negatives = torch.zeros(cfg.batch_size, rows(2 * w), cfg.negative, dtype=torch.int64, device=device)
            try:
                step_fn(model.inp.data, model.out.data, ctx, ctx > 0, center, negatives, lr, cbow, acc)
            except Exception as exc:  # no C++ compiler, unsupported platform, ...
                raise ConfigError(
                    f"word2vec: torch.compile of the SGD step failed "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                    f"fix: install a C++ compiler (g++) or set word2vec.compile: "
                    f"false"
                ) from exc
        acc.zero_()
    compile_s = time.perf_counter() - t0
    total = raw_words * cfg.epochs
    bar = progress(total=total, unit="w", unit_scale=True, desc="word2vec") if progress else None
    steps, losses, last = 0, [], (0.0, 0.0)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for epoch in range(cfg.epochs):
        for a, z in bounds:
            plan = plan_epoch(ids[a:z], sid[a:z], keep, cfg.window, cfg.batch_size, rng, device)
            chunk_raw, done, n = raw_words * (z - a) / len(ids), 0, len(plan.batches)
            for i, batch in enumerate(plan.batches, 1):
                frac = (epoch + (a + (z - a) * i / n) / len(ids)) / cfg.epochs
                if cfg.schedule == "linear":  # word2vec: decay linearly with words processed
                    lr.fill_(max(cfg.min_lr, cfg.lr - (cfg.lr - cfg.min_lr) * frac))
                step(*batch)
                steps += 1
                if steps % cfg.log_every == 0:  # mean loss per pair since the last log
                    now = acc.tolist()
                    losses.append((now[0] - last[0]) / max(now[1] - last[1], 1.0))
                    last = now
                    if log:
                        log({"loss": losses[-1], "lr": float(lr), "epoch": frac * cfg.epochs}, steps)
                if bar is not None:
                    words = int(chunk_raw * i / n) - done
                    bar.update(words)
                    done += words
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if bar is not None:
        bar.close()
    pairs = float(acc[1])
    stats = {
        "train_seconds": seconds,
        "words_per_s": total / seconds,
        "train_cpu_s": cpu,
        "words_per_cpu_s": total / cpu,
        "compile_s": compile_s,
        "steps": steps,
        "examples": pairs,
        "examples_per_s": pairs / seconds,
        "loss_first": losses[0] if losses else float("nan"),
        "loss_final": losses[-1] if losses else float("nan"),
    }
    return model.inp.detach().cpu().numpy().astype(np.float32), stats
