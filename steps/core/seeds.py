"""Seed groups: one cell trained under N seeds, each outcome reported as its mean over the seeds with
a 95 % interval, and comparisons between cells (or against a target) decided by those intervals.

The interval is Student's t over the seeds (mean ± t(0.975, n-1)·sd/√n): with 3-5 seeds a bootstrap
has too few distinct resamples to say anything, and the t-interval is the textbook one for a mean
of a few independent runs. Where two cells share their seeds (seed, seed+1, ...) they are compared
paired: the t-interval of the per-seed differences, which cancels what a seed does to both (the same
data order, the same initial head), so a real difference shows with fewer seeds.

Names every cell shares (metrics.json and the cell's MLflow run):
    <metric>        the mean over the seeds
    <metric>_sd     the sample standard deviation over the seeds
    <metric>_low    the 95 % interval's ends (Student's t over the seeds)
    <metric>_high
    seeds           how many seeds the cell trained

This module is imported by every job (steps/core/job.py): NumPy and scipy.special only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

CONFIDENCE = 0.95
SUFFIXES = ("_sd", "_low", "_high")
NOT_DECIDED = "not decided"
METHOD = "Student's t over seeds, 95 %"


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student's t quantile (scipy.special.stdtrit: what scipy.stats.t.ppf calls)."""
    from scipy import special

    return float(special.stdtrit(df, 0.5 + confidence / 2))


@dataclass(frozen=True)
class Interval:
    """A mean over seeds with its 95 % interval; n == 1: the one value, no interval (low = high = None)."""

    mean: float
    sd: float | None
    low: float | None
    high: float | None
    n: int

    @property
    def decided(self) -> bool:
        return self.low is not None and self.high is not None

    def text(self, fmt=lambda v: f"{v:.4g}") -> str:
        """'mean [low, high] (n seeds)', or 'v (1 seed: no interval)'."""
        if not self.decided:
            return f"{fmt(self.mean)} (1 seed: no interval)"
        return f"{fmt(self.mean)} [{fmt(self.low)}, {fmt(self.high)}] ({self.n} seeds)"


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean, sample sd and Student's t interval of `values` (one per seed)."""
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not xs:
        raise ValueError("an interval needs at least one value")
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return Interval(mean, None, None, None, 1)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(n - 1, confidence) * sd / math.sqrt(n)
    return Interval(mean, sd, mean - half, mean + half, n)


# Metric keys that time, rate or measure the process, or are the ends of an interval the stage took
# itself (a paired timing, a bootstrap over questions): a seed does not move them, the machine's load
# does. The cell keeps its first seed's (that seed's run is the cell's own), never a mean over seeds.
MEASURED = re.compile(
    r"per_s|_s$|_s_|steps_s|tokens_s|mfu|peak|time|runtime|speed|_over_|_vs_|_pairs$|_low$|_high$|_lo$|_hi$"
)


def aggregate(
    per_seed: Sequence[Mapping[str, float | None]], measured: re.Pattern = MEASURED
) -> dict[str, float | None]:
    """The cell's metrics from each seed's (the first seed first): every outcome's mean, and where
    the seeds differ its `_sd`, `_low`, `_high` (a number every seed gave alike, a parameter count
    say, has no spread to show); `seeds`. A metric some seed lacks is averaged over the seeds that
    have it; a `measured` one (a timing, MEASURED) is the first seed's."""
    keys = list(dict.fromkeys(k for m in per_seed for k in m))
    out: dict[str, float | None] = {}
    for key in keys:
        if measured.search(key):
            first = per_seed[0].get(key)
            out[key] = None if first is None else float(first)
            continue
        values = [m.get(key) for m in per_seed]
        values = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if not values:  # no seed has it (a peak this device does not publish): null, as one seed's would be
            out[key] = None
            continue
        iv = interval(values)
        out[key] = iv.mean
        if iv.decided and max(values) != min(values):
            out |= {f"{key}_sd": iv.sd, f"{key}_low": iv.low, f"{key}_high": iv.high}
    out["seeds"] = float(len(per_seed))
    return out


def is_seed_stat(key: str, keys) -> bool:
    """`key` is one of the spread names of another key in `keys` (`x_sd`, `x_low`, `x_high`)."""
    return any(key.endswith(s) and key[: -len(s)] in keys for s in SUFFIXES)


def compare(
    a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True, paired: bool | None = None
) -> str:
    """Which of two cells' per-seed outcomes is better, decided by the interval of the difference
    a - b: 'a better' / 'b better' where it excludes 0, else 'not decided'. `paired` (default: both
    have the same number of seeds, taken as the same seeds) uses the per-seed differences; unpaired,
    Welch's interval. One seed on either side: 'not decided'."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) < 2 or len(b) < 2:
        if len(a) >= 2 and len(b) == 1:  # a point against a group: does the group's interval exclude it?
            return against(a, b[0], higher_is_better=higher_is_better, names=("a better", "b better"))
        if len(b) >= 2 and len(a) == 1:
            flipped = against(b, a[0], higher_is_better=higher_is_better, names=("b better", "a better"))
            return flipped
        return NOT_DECIDED
    paired = len(a) == len(b) if paired is None else paired
    if paired:
        d = interval([x - y for x, y in zip(a, b)])
        low, high = d.low, d.high
    else:
        ia, ib = interval(a), interval(b)
        va, vb = ia.sd**2 / ia.n, ib.sd**2 / ib.n
        if va + vb == 0:
            low = high = ia.mean - ib.mean
        else:
            dof = (va + vb) ** 2 / ((va**2 / (ia.n - 1)) + (vb**2 / (ib.n - 1)))
            half = t_quantile(max(1, int(dof))) * math.sqrt(va + vb)
            low, high = ia.mean - ib.mean - half, ia.mean - ib.mean + half
    if low > 0:
        return "a better" if higher_is_better else "b better"
    if high < 0:
        return "b better" if higher_is_better else "a better"
    return NOT_DECIDED


def against(values: Sequence[float], target: float, *, higher_is_better: bool = True, names=("met", "missed")) -> str:
    """A group's outcome against a fixed target (or a deterministic point): met where its interval
    lies wholly on the good side, missed wholly on the other, else 'not decided'."""
    iv = interval(values)
    if not iv.decided:
        return NOT_DECIDED
    good, bad = (iv.low > target, iv.high < target) if higher_is_better else (iv.high < target, iv.low > target)
    return names[0] if good else names[1] if bad else NOT_DECIDED


def verdict_of_intervals(a: tuple[float, float], b: tuple[float, float], higher_is_better: bool = True) -> str:
    """Two cells known only by their intervals (a report row, a compare row): 'a better' / 'b better'
    where the intervals do not overlap, else 'not decided' (conservative: overlapping 95 % intervals
    can still differ; the paired test above decides more where the seeds are at hand)."""
    (a_lo, a_hi), (b_lo, b_hi) = a, b
    if a_lo > b_hi:
        return "a better" if higher_is_better else "b better"
    if a_hi < b_lo:
        return "b better" if higher_is_better else "a better"
    return NOT_DECIDED
