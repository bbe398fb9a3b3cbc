"""One stage's runs as a table, as `dvc exp show` lays them out: one row per cell (its latest job run),
the stage's headline metrics (its presentation, steps/presentation/<stage>.py) and only the params
that differ between the rows, nested params collapsed to their leaves (dotted keys)."""

from __future__ import annotations

import json
import math
from datetime import datetime

import pandas as pd

ID_COLUMNS = ["cell", "status"]
TAIL_COLUMNS = ["run", "start"]  # last: the first to go when the terminal is narrow
# a metric `k` logged with an interval: `k<low>` and `k<high>` (steps/paired.py: a ratio measured side by
# side; steps/mcq/evaluate.py: a bootstrap CI; perf: the spread of its steps' tokens/s)
INTERVALS = (("_low", "_high"), ("_lo", "_hi"), ("_p10", "_p90"))
RATIO = ("_low", "_high")  # a paired ratio: its interval above 1 means faster, below 1 slower


def stage_metrics(stage: str, requested: list[str] | None = None, logged: set[str] | None = None) -> dict[str, str]:
    """{column title: metric key}: `requested` keys, else the `metrics.*` columns of the stage's report
    table, its headline first (steps/presentation/<stage>.py), else every metric logged."""
    if requested:
        return {k.removeprefix("metrics."): k.removeprefix("metrics.") for k in requested}
    shown = presentation_of(stage)
    if shown is None:
        return {k: k for k in sorted(logged or ())}
    cols = {title: ref.removeprefix("metrics.") for title, ref in shown.columns.items() if ref.startswith("metrics.")}
    head = shown.headline[1] if shown.headline else None
    return {t: cols[t] for t in sorted(cols, key=lambda t: t != head)}


def without_interval_ends(metrics: dict[str, str]) -> dict[str, str]:
    """`metrics` less those that are the logged interval of another one (`k_low` beside `k`)."""
    keys = set(metrics.values())
    ends = {k + end for k in keys for pair in INTERVALS for end in pair}
    return {t: k for t, k in metrics.items() if k not in ends}


def presentation_of(stage: str):
    """The stage's presentation, or None for an experiment with none (a stage renamed since its runs,
    a module of another checkout): compare then shows every metric, and never an import error."""
    from importlib.util import find_spec

    from steps.core.stage import presentation

    if find_spec(f"steps.presentation.{stage}") is None:
        return None
    return presentation(stage)


def job_runs(runs: list[dict]) -> list[dict]:
    """The runs of jobs (tagged with their cell), not those nested under a job (word2vec's seeds)."""
    tagged = [r for r in runs if "cell" in r["tags"]]
    jobs = {r["run_id"] for r in tagged}
    return [r for r in tagged if r["tags"].get("mlflow.parentRunId") not in jobs]


def latest_per_cell(jobs: list[dict], until: float = math.inf) -> list[dict]:
    """The newest job run of each cell started by `until` (ms), in order of start."""
    newest: dict[str, dict] = {}
    for r in jobs:
        if r["start"] <= until:
            cell = r["tags"]["cell"]
            if cell not in newest or r["start"] >= newest[cell]["start"]:
                newest[cell] = r
    return sorted(newest.values(), key=lambda r: (r["start"], r["run_id"]))


def leaves(key: str, value: str) -> dict[str, str]:
    """A param as its leaves: a JSON object, or a list holding objects (a nested section logged as one
    value), becomes `key.sub` / `key[i]` (`key[name]` where each item has a distinct name); anything
    else stays one value."""
    parsed = _json(value)
    return _flat(key, parsed) if _nested(parsed) else {key: value}


def _nested(obj) -> bool:
    return (
        bool(obj) and isinstance(obj, dict) or isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj)
    )


def _flat(key: str, obj) -> dict[str, str]:
    if not _nested(obj):  # a leaf as MlflowRun logs a param: JSON for a list, str() for a scalar
        return {key: json.dumps(obj) if isinstance(obj, (list, dict)) else str(obj)}
    out: dict[str, str] = {}
    for sub, v in _items(obj).items():
        out.update(_flat(f"{key}{sub}", v))
    return out


def _json(value: str):
    if not value or value[0] not in "[{":
        return None
    try:
        return json.loads(value)
    except ValueError:  # a value cut at MLflow's length limit
        return None


def _items(parsed) -> dict[str, object]:
    if isinstance(parsed, dict):
        return {f".{k}": v for k, v in parsed.items()}
    names = [v.get("name") for v in parsed if isinstance(v, dict)]
    if len(names) == len(parsed) and None not in names and len(set(map(str, names))) == len(names):
        return {f"[{n}]": v for n, v in zip(names, parsed)}
    return {f"[{i}]": v for i, v in enumerate(parsed)}


def fmt_start(ms: float) -> str:
    """A run's start time (ms since the epoch) in local time, to the minute."""
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M")


def frame(runs: list[dict], link=None) -> pd.DataFrame:
    """One row per run: cell, status, run (id prefix), start, `params.<leaf>`, `metrics.<key>`, and
    `link` (the run's UI page, `link(experiment_id, run_id)`) when asked."""
    rows = []
    for r in runs:
        params = {}
        for k, v in r["params"].items():
            params.update(leaves(k, v))
        rows.append(
            {
                "cell": r["tags"].get("cell", "?"),
                "status": r["tags"].get("status", str(r["status"]).lower()),
                "run": r["run_id"][:8],
                "start": fmt_start(r["start"]),
                **({"link": link(r["experiment_id"], r["run_id"])} if link else {}),
                **{f"params.{k}": v for k, v in params.items()},
                **{f"metrics.{k}": v for k, v in r["metrics"].items()},
            }
        )
    return pd.DataFrame(rows, columns=None if rows else [*ID_COLUMNS, *TAIL_COLUMNS])


def differs(col: pd.Series) -> bool:
    """Whether a column holds two different values (a missing value counts as one)."""
    return col.astype(object).where(col.notna(), "-").astype(str).nunique() > 1


def interval_of(columns, key: str) -> tuple[str, str] | None:
    """The suffixes of `key`'s logged interval (INTERVALS), if both ends are columns of `columns`."""
    for lo, hi in INTERVALS:
        if f"metrics.{key}{lo}" in columns and f"metrics.{key}{hi}" in columns:
            return lo, hi
    return None


def interval_text(v, lo, hi, ratio: bool, seeds=None) -> str | None:
    """'v [lo, hi]', and for a paired ratio its verdict: faster (the interval lies above 1), slower
    (below), ~ (it holds 1); for a seed group's mean (`seeds`: its count) '(n seeds)'."""
    if v is None or pd.isna(v):
        return None
    if pd.isna(lo) or pd.isna(hi):
        return f"{v:.3g}"
    if seeds is not None and not pd.isna(seeds):
        return f"{v:.3g} [{lo:.3g}, {hi:.3g}] ({int(seeds)} seeds)"
    verdict = (" faster" if lo > 1 else " slower" if hi < 1 else " ~") if ratio else ""
    return f"{v:.3g} [{lo:.3g}, {hi:.3g}]{verdict}"


def seed_counts(runs: pd.DataFrame, key: str) -> pd.Series:
    """Each row's seed count where `key`'s interval is a seed group's (it has `_sd` beside it,
    steps/core/seeds.py; a paired ratio's has none), else NaN."""
    nan = pd.Series([math.nan] * len(runs), index=runs.index, dtype=float)
    if f"metrics.{key}_sd" not in runs.columns or "metrics.seeds" not in runs.columns:
        return nan
    return runs["metrics.seeds"].where(runs[f"metrics.{key}_sd"].notna())


def metric_columns(runs: pd.DataFrame, metrics: dict[str, str], combine: bool) -> dict[str, pd.Series]:
    """{title: values} of the stage's metrics; `combine`: a metric with an interval as one text column
    ('v [lo, hi] verdict') whose low/high columns then go; else every number as it is."""
    keys = set(metrics.values())
    ends = set()
    if combine:
        for key in keys:
            pair = interval_of(runs.columns, key)
            if pair and pair != INTERVALS[2]:  # p10/p90 are the stage's own columns (a spread, not a CI)
                ends |= {key + pair[0], key + pair[1]}
    out = {}
    for title, key in metrics.items():
        if key in ends:
            continue
        col = runs.get(f"metrics.{key}", pd.Series([math.nan] * len(runs), index=runs.index, dtype=float))
        pair = interval_of(runs.columns, key) if combine else None
        if pair and pair != INTERVALS[2]:
            lo, hi = runs[f"metrics.{key}{pair[0]}"], runs[f"metrics.{key}{pair[1]}"]
            col = pd.Series(
                [interval_text(v, a, b, pair == RATIO, n) for v, a, b, n in zip(col, lo, hi, seed_counts(runs, key))],
                index=runs.index,
                dtype=object,
            )
        out[title] = col
    return out


def build_table(runs: pd.DataFrame, metrics: dict[str, str], only_changed: bool = False, combine: bool = True):
    """(the table, the number of params equal in every row). Columns: cell, status, the metrics
    (dropped where no row has a value; `only_changed`: also where every row has the same), the params
    that differ, run, start (and link where `runs` has it)."""
    params = sorted(c for c in runs.columns if c.startswith("params."))
    varying = [c for c in params if differs(runs[c])]
    table = runs[[c for c in ID_COLUMNS if c in runs]].copy()
    if "metrics.seeds" in runs and "seeds" not in metrics.values():  # how many seeds each row's numbers are over
        table["seeds"] = pd.to_numeric(runs["metrics.seeds"], errors="coerce").fillna(1).astype(int)
    for title, col in metric_columns(runs, metrics, combine).items():
        if col.isna().all() or (only_changed and len(runs) > 1 and not differs(col)):
            continue
        table[title] = col if col.dtype == object else pd.to_numeric(col, errors="coerce")
    for c in varying:
        table[c.removeprefix("params.")] = runs[c]
    for c in [*TAIL_COLUMNS, "link"]:
        if c in runs:
            table[c] = runs[c]
    return table, len(params) - len(varying)


def sort_runs(runs: pd.DataFrame, key: str, metrics: dict[str, str], descending: bool) -> pd.DataFrame | None:
    """`runs` ordered by `key`: a column title, a metric key or a param leaf (with or without its
    `metrics.`/`params.` prefix); numbers as numbers, missing values last. None: no such column."""
    bare = key.removeprefix("metrics.").removeprefix("params.")
    candidates = [f"metrics.{metrics[key]}"] if key in metrics else []
    candidates += [key, f"metrics.{bare}", f"params.{bare}"]
    col = next((c for c in candidates if c in runs.columns), None)
    if col is None:
        return None
    values = pd.to_numeric(runs[col], errors="coerce")
    by = values if values.notna().any() else runs[col].astype(str)
    order = by.sort_values(ascending=not descending, na_position="last", kind="stable").index
    return runs.loc[order].reset_index(drop=True)
