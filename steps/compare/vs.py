"""`--vs previous|RUN`: the lab's results as of one lab run against those as of an earlier one.

A lab run is one `snakemake` invocation (experiment `n00bgpt/lab`, steps/tracking/lab.py); it reruns
only the jobs whose inputs changed, so "the results as of a lab run" are each cell's newest job run
started by the time that lab run ended (the cells it did not rerun keep their earlier run: `same`).
Each number shows its change; where both runs logged an interval for it (`_low`/`_high`, `_lo`/`_hi`,
`_p10`/`_p90`, steps/compare/table.py) the change is beyond noise when the intervals do not overlap.

What changed comes first: the cells that moved (rerun, then new, then gone), each kind in order of
its run's start, then the unchanged ones; why a cell reran (`params changed`) before its numbers. The
table and markdown formats show only what changed unless `--all` (steps/compare/__init__.py).
"""

from __future__ import annotations

import math

import pandas as pd

from steps.compare.formats import fmt
from steps.compare.read import CompareError
from steps.compare.table import INTERVALS, differs, fmt_start, frame, latest_per_cell

LEGEND = "↑/↓: beyond noise (the two runs' intervals do not overlap); ~: within noise (they overlap)"


LAB = "lab"  # the lab runs' experiment, n00bgpt/lab (steps/tracking/lab.py)


def lab_runs(runs: list[dict]) -> list[dict]:
    """The lab runs, oldest first."""
    return sorted(runs, key=lambda r: (r["start"], r["run_id"]))


def pick(labs: list[dict], spec: str | None, than: dict | None = None) -> dict:
    """The lab run `spec` names: None/'latest' the newest, 'previous' the one before `than` (default
    the newest), else a run id or a prefix of one."""
    if not labs:
        raise CompareError("the store has no lab run (experiment n00bgpt/lab): run the DAG with `snakemake` first")
    if spec in (None, "latest"):
        return labs[-1]
    if spec == "previous":
        at = labs.index(than) if than is not None else len(labs) - 1
        if at == 0:
            raise CompareError(
                f"no lab run before {labs[at]['run_id'][:8]} ({describe(labs[at])}): the store has "
                f"{len(labs)} lab run(s); run the DAG again after a change, or pass --vs RUN_ID"
            )
        return labs[at - 1]
    found = [r for r in labs if r["run_id"].startswith(spec)]
    if len(found) != 1:
        known = ", ".join(f"{r['run_id'][:8]} ({describe(r)})" for r in labs[-5:])
        what = "no" if not found else f"{len(found)}"
        raise CompareError(f"{what} lab run(s) match {spec!r}: give more of its id; the latest are {known}")
    return found[0]


def describe(lab: dict) -> str:
    """'<start time>, <status>': how a lab run is named in messages and titles."""
    return f"{fmt_start(lab['start'])}, {str(lab['status']).lower()}"


def cutoff(lab: dict) -> float:
    """The time (ms) by which a job run belongs to the results as of `lab`: its end (still running: now)."""
    return lab["end"] if lab.get("end") else math.inf


def change(now, before, same: bool, mark: str = "") -> str | None:
    """'now (+x%)' (or '(+x)' from zero), with the interval mark; the value alone where nothing moved."""
    if now is None or pd.isna(now):
        return None
    text = fmt(now)
    if same or before is None or pd.isna(before):
        return text
    if before == 0:
        return f"{text} ({now - before:+.3g}){mark}"
    return f"{text} ({(now - before) / abs(before):+.1%}){mark}"


def noise(now: pd.Series, before: pd.Series, key: str) -> str | None:
    """'up'/'down' (the intervals do not overlap) or 'within' (they do); None where either lacks one."""
    for lo, hi in INTERVALS:
        ends = [f"metrics.{key}{lo}", f"metrics.{key}{hi}"]
        vals = [now.get(ends[0]), now.get(ends[1]), before.get(ends[0]), before.get(ends[1])]
        if all(v is not None and not pd.isna(v) for v in vals):
            n_lo, n_hi, b_lo, b_hi = vals
            return "up" if n_lo > b_hi else "down" if n_hi < b_lo else "within"
    return None


MARKS = {"up": " ↑", "down": " ↓", "within": " ~", None: ""}
MOVES = ("rerun", "new", "gone", "same")  # the row order: what changed first
ORDER = "rows: what changed first (rerun, new, gone), each kind by its run's start"


def changed_first(table: pd.DataFrame) -> pd.DataFrame:
    """The rows in MOVES order (a stable sort: each kind keeps its order of start)."""
    if table.empty:
        return table
    rank = table["run"].map({m: i for i, m in enumerate(MOVES)})
    return table.iloc[rank.argsort(kind="stable")].reset_index(drop=True)


def moved(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the cells that changed (rerun, new or gone)."""
    return table[table["run"] != "same"] if len(table) else table


def stage_changes(jobs: list[dict], this: dict, prev: dict, metrics: dict[str, str]) -> pd.DataFrame:
    """One row per cell: how its run moved (rerun/same/new/gone), its status, for each metric its
    value, its value before, the change and the noise verdict, and the params that changed."""
    now = frame(latest_per_cell(jobs, cutoff(this))).set_index("cell", drop=False)
    before = frame(latest_per_cell(jobs, cutoff(prev))).set_index("cell", drop=False)
    cells = [*now.index, *(c for c in before.index if c not in now.index)]
    rows = []
    for cell in cells:
        n = now.loc[cell] if cell in now.index else pd.Series(dtype=object)
        b = before.loc[cell] if cell in before.index else pd.Series(dtype=object)
        same = n.get("run") == b.get("run")
        moved = "same" if same else "gone" if n.empty else "new" if b.empty else "rerun"
        row = {"cell": cell, "run": moved, "status": status(n.get("status"), b.get("status"))}
        row |= {"seeds": _num(n.get("metrics.seeds")), "seeds before": _num(b.get("metrics.seeds"))}
        for title, key in metrics.items():
            v, w = _num(n.get(f"metrics.{key}")), _num(b.get(f"metrics.{key}"))
            delta = None if same or v is None or w is None else v - w
            verdict = None if same else noise(n, b, key)
            row |= {title: v, f"{title} before": w, f"{title} change": delta, f"{title} noise": verdict}
        row["params changed"] = "" if same else params_changed(n, b)
        rows.append(row)
    return pd.DataFrame(rows)


def status(now: str | None, before: str | None) -> str | None:
    """The cell's status, 'failed→ok' where it changed."""
    return now if before is None or now is None or now == before else f"{before}→{now}"


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def params_changed(now: pd.Series, before: pd.Series) -> str:
    """'key: old→new; ...' for the param leaves that differ between the two runs of a cell."""
    if now.empty or before.empty:
        return ""
    keys = sorted(k for k in {*now.index, *before.index} if k.startswith("params."))
    moved = [k for k in keys if differs(pd.Series([now.get(k), before.get(k)], dtype=object))]
    return "; ".join(f"{k.removeprefix('params.')}: {before.get(k, '-')}→{now.get(k, '-')}" for k in moved)


def keep_changed(table: pd.DataFrame, metrics: dict[str, str]) -> dict[str, str]:
    """--only-changed: the metrics that moved in some row, and those with values somewhere."""
    return {
        t: k
        for t, k in metrics.items()
        if table[f"{t} change"].fillna(0).ne(0).any() or (table[t].notna() != table[f"{t} before"].notna()).any()
    }


def drop_empty(table: pd.DataFrame, metrics: dict[str, str]) -> dict[str, str]:
    """The metrics some row has a value of (now or before)."""
    return {t: k for t, k in metrics.items() if table[t].notna().any() or table[f"{t} before"].notna().any()}


def as_text(table: pd.DataFrame, metrics: dict[str, str]) -> pd.DataFrame:
    """The table for reading: why each cell reran (its changed params) first, then its seeds and each
    metric as one column, 'now (change)' with its noise mark."""
    out = table[["cell", "run", "status", "params changed"]].copy()
    out["seeds"] = [seeds_text(n, b) for n, b in zip(table["seeds"], table["seeds before"])]
    for t in metrics:
        out[t] = [
            change(v, w, r == "same", MARKS.get(n if isinstance(n, str) else None, ""))
            for v, w, r, n in zip(table[t], table[f"{t} before"], table["run"], table[f"{t} noise"])
        ]
    return out


def as_raw(table: pd.DataFrame, metrics: dict[str, str]) -> pd.DataFrame:
    """The table for csv/json: per metric its value, value before, change and noise verdict."""
    cols = [c for t in metrics for c in (t, f"{t} before", f"{t} change", f"{t} noise")]
    return table[["cell", "run", "status", "params changed", "seeds", "seeds before", *cols]]


def seeds_text(now, before) -> str:
    """How many seeds a cell's numbers are over: '3', '3 (was 1)'; '1' for a run of one seed (its
    numbers carry no seed interval: their changes read without a noise mark)."""
    n = 1 if now is None or pd.isna(now) else int(now)
    b = None if before is None or pd.isna(before) else int(before)
    return f"{n}" if b is None or b == n else f"{n} (was {b})"


def title(this: dict, prev: dict) -> str:
    return f"lab run {this['run_id'][:8]} ({describe(this)}) vs {prev['run_id'][:8]} ({describe(prev)})"
