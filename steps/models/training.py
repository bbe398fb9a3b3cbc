"""Training loop pieces around the one training step (train_step.py: AdamW with decay groups,
accumulation, clipping, every perf knob): token windows, warmup+cosine LR, evaluation, the loop,
and checkpoints that make a killed run resume exactly (the ours-vs-HF step benchmark is
steps/models/bench.py).

Exact resume: the batch of step s is drawn from an RNG seeded by (seed, s, micro-step), and the
checkpoint holds model, optimizer, torch RNG (dropout) and the metric history, so a run killed
after step k and restarted reaches the same weights as one that never stopped.

A checkpoint is tensors and plain data (dicts, lists, numbers, strings: the model config as a dict),
so it loads with `torch.load(weights_only=True)` and no allow-list: a file that asks to unpickle
anything else (a crafted pickle whose objects would run code) is refused before any of it runs.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from steps.core.errors import InputError
from steps.models.gpt import GPTLMHeadModel
from steps.models.train_config import GptTrainConfig
from steps.models.train_step import StepOptions, TrainStep, autocast


class TokenWindows:
    """Random windows of a 1-D token stream; labels are the inputs (the model shifts)."""

    def __init__(self, tokens: np.ndarray, block_size: int, seed: int):
        if len(tokens) <= block_size:
            raise ValueError(f"only {len(tokens)} tokens for block_size {block_size}")
        self.tokens, self.T, self.seed = torch.from_numpy(tokens.astype(np.int64)), block_size, seed

    def batch(self, batch_size: int, *key: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, *key])
        starts = torch.from_numpy(rng.integers(0, len(self.tokens) - self.T, batch_size))
        return self.tokens[starts[:, None] + torch.arange(self.T)]


def lr_at(step: int, lr: float, warmup: int, max_steps: int, min_ratio: float) -> float:
    """Linear warmup to lr, then cosine decay to lr * min_ratio at max_steps."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def evaluate(model, data: TokenWindows, batch_size: int, n_batches: int, device, amp: str) -> float:
    was = model.training
    model.eval()
    losses = []
    for i in range(n_batches):
        x = data.batch(batch_size, 10**9, i).to(device)  # the same validation windows every time
        with autocast(device, amp):
            losses.append(model(x, labels=x).loss.item())
    model.train(was)
    return float(np.mean(losses))


@dataclass
class TrainState:
    step: int = 0
    history: list = field(default_factory=list)  # dicts: step, lr, train_loss[, val_loss]
    train_time_s: float = 0.0
    tokens: int = 0


def save_checkpoint(path: Path, model, opt, state: TrainState, extra: dict) -> None:
    """Atomic (write + rename): a kill during the save leaves the previous checkpoint intact."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "state": state.__dict__,
            "torch_rng": torch.get_rng_state(),
            **extra,
        },
        tmp,
    )
    os.replace(tmp, path)


def read_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """The checkpoint's dict, unpickled with torch's weights-only loader: a file holding anything but
    tensors and plain data raises InputError naming it (one line), and nothing in it runs."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines()]
        why = next((ln for ln in lines if "unsupported" in ln.lower()), "not a torch checkpoint")
        raise InputError(
            f"{path}: refused to load: a lab checkpoint holds only tensors and plain data, this file asks "
            f"for more ({why}); fix: delete it (its job writes a new one), or load it yourself if you trust it"
        ) from None


def load_checkpoint(path: Path, model, opt) -> tuple[TrainState, dict]:
    ck = read_checkpoint(path)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    torch.set_rng_state(ck["torch_rng"])
    return TrainState(**ck["state"]), ck


def train(
    model: GPTLMHeadModel,
    train_data: TokenWindows,
    val_data: TokenWindows,
    p: GptTrainConfig,
    device,
    ckpt: Path,
    extra: dict,
    log=lambda metrics, step: None,
    progress=None,
    stop_after: int | None = None,
) -> TrainState:
    """Train to p.max_steps, resuming from `ckpt` if it exists with the same fingerprint.
    `stop_after` ends the loop early (after its checkpoint) — the tests' stand-in for a kill."""
    ts = TrainStep(model, device, StepOptions.from_params(p))
    opt = ts.optimizer
    state = TrainState()
    if ckpt.exists() and p.resume:
        ck = read_checkpoint(ckpt)
        if ck.get("fingerprint") == extra.get("fingerprint"):
            state, _ = load_checkpoint(ckpt, model, opt)
            print(f"resumed from {ckpt} at step {state.step}")
            for rec in state.history:  # this job's MLflow run gets the whole curve
                log({k: v for k, v in rec.items() if k != "step"}, rec["step"])
        else:
            print(f"{ckpt} belongs to another config: starting fresh")
    model.train()
    steps = range(state.step, p.max_steps)
    bar = progress(steps, total=p.max_steps, initial=state.step) if progress else steps
    for step in bar:
        lr = lr_at(step, p.lr, p.warmup_steps, p.max_steps, p.min_lr_ratio)
        ts.set_lr(lr)
        batches = [train_data.batch(p.batch_size, step, m) for m in range(p.grad_accum)]
        t0 = time.perf_counter()
        loss, gnorm = ts.step(batches)
        gnorm = float(gnorm)
        state.train_time_s += time.perf_counter() - t0
        state.tokens += sum(b.numel() for b in batches)
        state.step = step + 1
        rec = {"step": state.step, "lr": lr, "train_loss": loss, "grad_norm": gnorm}
        if state.step % p.eval_interval == 0 or state.step == p.max_steps:
            rec["val_loss"] = evaluate(model, val_data, p.batch_size, p.eval_batches, device, p.amp)
            rec["val_ppl"] = math.exp(rec["val_loss"])
        state.history.append(rec)
        log({k: v for k, v in rec.items() if k != "step"}, state.step)
        if progress:
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if state.step % p.ckpt_interval == 0 or state.step == p.max_steps:
            save_checkpoint(ckpt, model, opt, state, extra)
        if stop_after is not None and state.step >= stop_after:
            break
    return state
