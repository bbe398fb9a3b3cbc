"""Compare the lab's runs in the terminal, in the spirit of DVC's `exp show`:

    python -m steps.compare [--stage perf] [--diff] [--all] [--metrics k1,k2] [--tracking-uri URI]

Per stage (its MLflow experiment `n00bgpt/<stage>`) one table, one row per cell (the latest run of
each cell; `--all`: every run): cell, status, start time, run id, the params that differ between
the rows, and the stage's key metrics: the `metrics.*` columns of its report table (the Stage
object in steps/<stage>.py), or `--metrics`. Params equal in every row are listed under the table;
`--diff` shows only what differs (params and metrics). The store is the one the jobs write to:
`--tracking-uri`, else $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db (steps.tracking.store).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pandas as pd

from steps.core.stage import presentation
from steps.tracking import store

ID_COLUMNS = ["cell", "status", "start", "run"]
MAX_CELL = 28  # characters of a value in the table (a ratio with its interval and verdict fits)


class CompareError(Exception):
    """Bad input: no store, unknown stage, unknown metric. The message says how to fix it."""


def open_store(uri: str | None):
    """A read-only MlflowClient on the lab's store; never creates an empty database."""
    from mlflow.tracking import MlflowClient

    uri = store.tracking_uri(uri)
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.exists():
            raise CompareError(
                f"no MLflow store at {db.resolve()}: run the DAG first (`snakemake --cores 2`, or "
                "`snakemake --cores 2 --configfile configs/smoke.yaml` for the tiny one), or pass --tracking-uri"
            )
    client = MlflowClient(uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - MlflowException, connection errors: say which store
        raise CompareError(f"cannot read the MLflow store {uri}: {exc}") from None
    return client, uri


def stage_experiments(client) -> dict:
    """{stage: experiment} for the lab's experiments (`n00bgpt/<stage>`), in creation order."""
    prefix = f"{store.EXPERIMENT_PREFIX}/"
    exps = [e for e in client.search_experiments(max_results=1000) if e.name.startswith(prefix)]
    return {e.name.removeprefix(prefix): e for e in sorted(exps, key=lambda e: int(e.experiment_id))}


def _all_runs(client, experiment_id: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def job_runs(client, experiment_id: str, latest: bool = True) -> pd.DataFrame:
    """One row per job run (a run tagged with its cell; runs nested under a job, such as seeds,
    are not jobs), oldest first; `latest`: only the newest run of each cell."""
    runs = [r for r in _all_runs(client, experiment_id) if "cell" in r.data.tags]
    jobs = {r.info.run_id for r in runs}
    rows = []
    for r in runs:
        if r.data.tags.get("mlflow.parentRunId") in jobs:
            continue
        start = datetime.fromtimestamp(r.info.start_time / 1000)
        rows.append(
            {
                "cell": r.data.tags["cell"],
                "status": r.data.tags.get("status", r.info.status.lower()),
                "start": start.strftime("%Y-%m-%d %H:%M"),
                "run": r.info.run_id[:8],
                "_t": r.info.start_time,
                **{f"params.{k}": v for k, v in r.data.params.items()},
                **{f"metrics.{k}": v for k, v in r.data.metrics.items()},
            }
        )
    df = pd.DataFrame(rows, columns=[*ID_COLUMNS, "_t"] if not rows else None)
    if latest and len(df):
        df = df.sort_values("_t").drop_duplicates("cell", keep="last")
    return df.sort_values("_t", kind="stable").drop(columns="_t").reset_index(drop=True)


def key_metrics(stage: str, requested: list[str] | None = None) -> dict[str, str]:
    """{column title: 'metrics.<key>'}: `requested` keys, else the stage's report columns."""
    if requested:
        return {k.removeprefix("metrics."): f"metrics.{k.removeprefix('metrics.')}" for k in requested}

    try:
        columns = presentation(stage).columns
    except (ImportError, LookupError) as exc:
        print(f"({stage}: no presentation to name its key metrics ({exc}); showing wall time only)")
        return {"wall time s": "metrics.wall_time_s"}
    return {title: ref for title, ref in columns.items() if ref.startswith("metrics.")}


def _differs(col: pd.Series) -> bool:
    return col.astype(object).where(col.notna(), "-").astype(str).nunique() > 1


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if (v.is_integer() or abs(v) >= 1e4) and abs(v) < 1e12 else f"{v:.4g}"
    s = str(v)
    return s if len(s) <= MAX_CELL else s[: MAX_CELL - 1] + "…"


def with_interval(runs: pd.DataFrame, ref: str) -> pd.Series | None:
    """A side-by-side ratio (`<key>` with `<key>_low`/`_high`, steps/paired.py) as one column,
    "v [low, high] faster|slower|~" (~: the interval holds 1); None for any other metric."""
    if not {ref, f"{ref}_low", f"{ref}_high"} <= set(runs.columns):
        return None

    def one(v, lo, hi):
        if pd.isna(v):
            return None
        if pd.isna(lo) or pd.isna(hi):
            return f"{v:.3g}"
        return f"{v:.3g} [{lo:.3g}, {hi:.3g}] " + ("faster" if lo > 1 else "slower" if hi < 1 else "~")

    return pd.Series(
        [one(*t) for t in zip(runs[ref], runs[f"{ref}_low"], runs[f"{ref}_high"])], index=runs.index, dtype=object
    )


def build_table(runs: pd.DataFrame, metrics: dict[str, str], diff: bool = False) -> tuple[pd.DataFrame, dict]:
    """(the table to print, {param: value} equal in every row). `diff` also drops metrics equal in
    every row (with two rows or more). A ratio measured side by side shows with its interval and
    verdict in one column (its _low/_high columns then go)."""
    params = sorted(c for c in runs.columns if c.startswith("params."))
    varying = [c for c in params if _differs(runs[c])]
    constant = {c.removeprefix("params."): runs[c].iloc[0] for c in params if c not in varying} if len(runs) else {}
    table = runs[ID_COLUMNS].copy()
    for c in varying:
        table[c.removeprefix("params.")] = runs[c]
    combined = {ref for ref in metrics.values() if with_interval(runs, ref) is not None}
    for title, ref in metrics.items():
        if ref.removesuffix("_low").removesuffix("_high") in combined - {ref}:
            continue
        col = runs[ref] if ref in runs.columns else pd.Series([None] * len(runs), dtype=object)
        if diff and len(runs) > 1 and not _differs(col):
            continue
        table[title] = (
            with_interval(runs, ref).values if ref in combined else pd.to_numeric(col, errors="coerce").values
        )
    return table, constant


def text_table(table: pd.DataFrame, width: int) -> str:
    """Plain text, numbers right-aligned, text left-aligned; columns that do not fit in `width`
    continue in a further block below, each block led by the first column (the cell)."""
    cols = []
    for name in table.columns:
        just = str.rjust if pd.api.types.is_numeric_dtype(table[name]) else str.ljust
        cells = [str(name), *map(_fmt, table[name])]
        w = max(map(len, cells))
        cols.append([just(c, w) for c in cells])
    lead, blocks = cols[0], [[]]
    for col in cols[1:]:
        used = len(lead[0]) + sum(len(c[0]) + 2 for c in blocks[-1])
        if blocks[-1] and used + 2 + len(col[0]) > width:
            blocks.append([])
        blocks[-1].append(col)
    return "\n\n".join(
        "\n".join("  ".join([lead[i], *(c[i] for c in block)]).rstrip() for i in range(len(lead))) for block in blocks
    )


def render(stage: str, table: pd.DataFrame, constant: dict, latest: bool, diff: bool, width: int) -> str:
    which = "latest run per cell" if latest else "all runs"
    lines = [f"== {stage}: {len(table)} run(s), {which} =="]
    if table.empty:
        return "\n".join([*lines, "(no runs)"])
    lines.append(text_table(table, width))
    if constant and not diff:
        same = ", ".join(f"{k}={_fmt(v)}" for k, v in constant.items())
        lines += textwrap.wrap(f"same in every row: {same}", width=width, subsequent_indent="  ")
    return "\n".join(lines)


def compare(
    stages: list[str] | None = None,
    uri: str | None = None,
    diff: bool = False,
    latest: bool = True,
    metrics: list[str] | None = None,
    width: int = 120,
) -> str:
    client, uri = open_store(uri)
    exps = stage_experiments(client)
    if not exps:
        raise CompareError(f"the store {uri} has no {store.EXPERIMENT_PREFIX}/<stage> experiments: run the DAG first")
    unknown = [s for s in stages or [] if s not in exps]
    if unknown:
        raise CompareError(f"unknown stage {', '.join(unknown)}: the store {uri} has runs of {', '.join(exps)}")
    blocks = []
    for stage in stages or list(exps):
        runs = job_runs(client, exps[stage].experiment_id, latest=latest)
        table, constant = build_table(runs, key_metrics(stage, metrics), diff=diff)
        blocks.append(render(stage, table, constant, latest, diff, width))
    return "\n\n".join(blocks)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m steps.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", action="append", help="a stage (repeatable, or a,b); default: every stage in the store")
    ap.add_argument("--diff", action="store_true", help="only the params and metrics that differ between rows")
    ap.add_argument("--all", action="store_true", help="every run, not only the latest of each cell")
    ap.add_argument("--metrics", help="comma-separated metric keys instead of the stage's report columns")
    ap.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db")
    args = ap.parse_args(argv)
    width = shutil.get_terminal_size((120, 24)).columns
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    stages = [s.strip() for arg in args.stage for s in arg.split(",") if s.strip()] if args.stage else None
    try:
        print(compare(stages, args.tracking_uri, args.diff, not args.all, metrics, width))
    except CompareError as exc:
        sys.exit(f"steps.compare: {exc}")


if __name__ == "__main__":
    main()
