"""Side-by-side timing: two things measured interleaved in one process, A B A B ..., and their
speed ratio with a 95 % interval.

On a shared, noisy machine a number taken minutes apart from another says little about their
ratio: the load moves between them. Interleaving puts both under the same load, pair by pair, and
the spread of the per-pair ratios says how far the ratio can be trusted.

The ratio is the geometric mean of the per-pair ratios (b_time / a_time: how many times faster A
is than B); its interval is Student's t on the logs of the per-pair ratios (exp(mean ± t·sd/√n)).
Logs because ratios multiply: 2× and 0.5× average to 1×, not 1.25×. A pair is one timing of each,
taken back to back, the order alternating (A B, B A, A B, ...) so neither always runs first.

    ratio = compare(run_cell, run_baseline, pairs=20, warmup=2)
    ratio.ratio, ratio.low, ratio.high, ratio.excludes_one
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import special  # stdtrit is what scipy.stats.t.ppf calls; scipy.stats costs ~1 s to import

CONFIDENCE = 0.95
MIN_PAIRS = 20  # the floor for a headline ratio


@dataclass(frozen=True)
class Ratio:
    """How many times faster A is than B: geometric mean over pairs, with its interval."""

    ratio: float
    low: float
    high: float
    pairs: int
    confidence: float = CONFIDENCE

    @property
    def excludes_one(self) -> bool:
        """The interval lies wholly above or wholly below 1: a difference, not noise."""
        return self.low > 1.0 or self.high < 1.0

    @property
    def verdict(self) -> str:
        if self.pairs < 2:
            return "too few pairs"
        if not self.excludes_one:
            return "no difference"
        return "faster" if self.low > 1.0 else "slower"

    def as_metrics(self, prefix: str) -> dict[str, float]:
        """`{prefix}`, `{prefix}_low`, `{prefix}_high`, `{prefix}_pairs`: names every cell shares."""
        return {
            prefix: self.ratio,
            f"{prefix}_low": self.low,
            f"{prefix}_high": self.high,
            f"{prefix}_pairs": self.pairs,
        }

    def __str__(self) -> str:
        return f"{self.ratio:.3g}x [{self.low:.3g}, {self.high:.3g}] ({self.pairs} pairs, {self.verdict})"

    def to_dict(self) -> dict:
        return {**asdict(self), "excludes_one": self.excludes_one, "verdict": self.verdict}


def ratio_of_pairs(a_times: Sequence[float], b_times: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    """Speed of A over B from paired durations (a_times[i] and b_times[i] measured back to back)."""
    a = np.asarray(a_times, dtype=np.float64)
    b = np.asarray(b_times, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired timings need two equal, non-empty 1-D lists (got {a.shape} and {b.shape})")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("durations must be positive")
    logs = np.log(b) - np.log(a)
    n = len(logs)
    mean = float(logs.mean())
    if n < 2:
        return Ratio(math.exp(mean), math.nan, math.nan, n, confidence)
    half = float(special.stdtrit(n - 1, 0.5 + confidence / 2)) * float(logs.std(ddof=1)) / math.sqrt(n)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, confidence)


def duration(
    fn: Callable[[], object], sync: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds one call of `fn` takes; `sync` (e.g. torch.cuda.synchronize) runs before each clock read."""
    if sync:
        sync()
    t0 = clock()
    fn()
    if sync:
        sync()
    return clock() - t0


def interleave(
    run_a: Callable[[], object],
    run_b: Callable[[], object],
    pairs: int = MIN_PAIRS,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] | None = None,
) -> tuple[list[float], list[float]]:
    """Durations of `pairs` calls of each, alternating A B / B A; `warmup` untimed calls of each
    first. `sync` (e.g. torch.cuda.synchronize) runs before each clock read."""
    for _ in range(warmup):
        run_a()
        run_b()
    a_times: list[float] = []
    b_times: list[float] = []

    def timed(fn) -> float:
        return duration(fn, sync, clock)

    for i in range(pairs):
        if i % 2 == 0:
            a_times.append(timed(run_a))
            b_times.append(timed(run_b))
        else:
            b_times.append(timed(run_b))
            a_times.append(timed(run_a))
    return a_times, b_times


def compare(run_a, run_b, pairs: int = MIN_PAIRS, warmup: int = 1, **kw) -> Ratio:
    """Interleave A and B and return how many times faster A is (interval included)."""
    return ratio_of_pairs(*interleave(run_a, run_b, pairs, warmup, **kw))
