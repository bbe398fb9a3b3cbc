"""A perf cell against its baseline cell: the Desc and Change columns (every resolved key that
differs), the speed ratio of the interleaved steps, and loss drift when both trained the same
trajectory. The baseline's resolved config and loss come from its metrics.json (the rule makes
every other cell depend on it); its speed never does: a number taken minutes earlier in another
job says little about this one's (steps/paired.py)."""

from __future__ import annotations

import json
from pathlib import Path

from steps.config.typed import trajectory_fields
from steps.core import StageRun
from steps.paired import Ratio, ratio_of_pairs
from steps.perf.config import PerfConfig

NOT_A_CHANGE = ("desc", "baseline_cell")  # what the cell is called and what it is timed against


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def describe_change(params: dict, base: dict) -> str:
    """`k=v` for every resolved key that differs from the baseline cell's resolved config."""
    a, b = flat(params), flat(base)
    return ", ".join(
        f"{k}={a.get(k)}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and k.split(".")[0] not in NOT_A_CHANGE
    )


def load_baseline(ctx: StageRun, p: PerfConfig) -> dict | None:
    """The baseline cell's metrics.json, the rule's `baseline` input (None for the baseline itself
    or a lone manual run)."""
    path = ctx.inputs.get("baseline")
    if ctx.cell == p.baseline_cell or not path:
        return None
    rec = json.loads(Path(path).read_text())
    return rec if rec.get("status") == "ok" else None


def describe_cell(ctx: StageRun, p: PerfConfig) -> dict | None:
    """Desc and Change columns (set before any skip; the change between the resolved configs as
    the job received them); returns the baseline record if available."""
    base = load_baseline(ctx, p)
    ctx.info |= {"desc": p.desc, "params": ctx.params}
    if ctx.cell == p.baseline_cell:
        ctx.info["change"] = ""
    else:
        ctx.info["change"] = describe_change(ctx.params, base["info"]["params"]) if base else "(baseline not available)"
    return base


def baseline_params(ctx: StageRun, p: PerfConfig, base: dict | None) -> PerfConfig | None:
    """The config of the step this cell is timed against: the baseline cell's (its own for the
    baseline cell: an A/A run against a second copy of itself), None without a baseline record."""
    if ctx.cell == p.baseline_cell:
        return p
    return PerfConfig.of(base["info"]["params"]) if base else None


def speed_ratio(cell_s, cell_tokens: int, base_s, base_tokens: int) -> Ratio:
    """How many times the baseline's tokens/s the cell's is, over the interleaved pairs (seconds
    per token, so cells with another batch size compare by throughput)."""
    return ratio_of_pairs([t / cell_tokens for t in cell_s], [t / base_tokens for t in base_s])


def compare_to_baseline(ctx: StageRun, p: PerfConfig, base: dict | None, metrics: dict, ratio: Ratio | None) -> None:
    """`speedup`, `speedup_low`, `speedup_high`, `speedup_pairs` (every cell, the baseline's A/A
    included) and loss drift vs the baseline cell (only when the trajectory is the same)."""
    if ratio is not None:
        metrics |= ratio.as_metrics("speedup")
        ctx.info["vs_baseline"] = ratio.verdict
    if ctx.cell == p.baseline_cell:
        metrics["loss_drift"] = 0.0
        ctx.info["vs_baseline"] = f"A/A noise check: {ratio.verdict}" if ratio else ""
        return
    if base is None:
        ctx.info["vs_baseline"] = "baseline not available"
        return
    bp = PerfConfig.of(base["info"]["params"])
    if ratio is not None and bp.baseline_cell != p.baseline_cell:
        # timed against a cell that is itself a change (fused softmax vs manual attention): say
        # which, so the headline (× the fp32 eager baseline) leaves it out
        ctx.info["vs_baseline"] = f"vs {p.baseline_cell}: {ratio.verdict}"
    if all(getattr(p, k) == getattr(bp, k) for k in trajectory_fields(PerfConfig)):
        metrics["loss_drift"] = metrics["loss"] - base["metrics"]["loss"]
    else:
        ctx.info["drift_note"] = "different batches or schedule: loss not comparable"
