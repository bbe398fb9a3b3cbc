"""Compare the lab's runs in the terminal, as `dvc exp show` does: one screen per stage, stages in DAG order.

    python -m steps.compare [--stage perf] [--sort METRIC] [--only-changed] [--format table|csv|json|markdown]
    python -m steps.compare --vs previous          # what changed since the lab run before (--all: everything)
    python -m steps.compare --sweep [KEY]          # a swept knob's runs by value (steps/compare/sweep.py)

Per stage (its MLflow experiment `n00bgpt/<stage>`) one table, one row per cell (its latest job run;
`--all`: every run): cell, status, the stage's headline metrics (the `metrics.*` columns of its report
table, steps/presentation/<stage>.py, headline first; or `--metrics`), only the params that differ
between the rows (nested params as their leaves, `a.b` / `a[name]`), the run id and start. A metric
logged with an interval shows it ("1.9 [1.7, 2.1] faster"). The store is read directly (SQL on the local
SQLite store; MLflow's client for a server), never created: `--tracking-uri`, else
$MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db (steps/tracking/store.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass

from steps.compare import formats, sweep, vs
from steps.compare.read import CompareError, Store, open_store, read
from steps.compare.table import (
    ID_COLUMNS,
    build_table,
    frame,
    job_runs,
    latest_per_cell,
    sort_runs,
    stage_metrics,
    without_interval_ends,
)

__all__ = ["ID_COLUMNS", "CompareError", "Options", "build_table", "compare", "main", "open_store"]
FORMATS = ("table", "csv", "json", "markdown")


@dataclass
class Options:
    """What to show (the command line's options, `main`)."""

    stages: list[str] | None = None  # None: every stage in the store
    only_changed: bool = False  # also drop the metrics equal in every row
    latest: bool = True  # the latest run of each cell, else every run
    metrics: list[str] | None = None  # metric keys instead of the stage's report columns
    sort: str | None = None  # a column title, metric key or param leaf
    descending: bool = False
    fmt: str = "table"
    width: int = 120
    vs: str | None = None  # 'previous' or a lab run id: the changes since that lab run
    lab: str | None = None  # the lab run compared (default the latest)
    ui: str = ""  # the UI's address for run links; "": relative to the UI's base (steps.tracking.describe)
    sweep: str | None = None  # --sweep: a sweep's runs by value ("": every sweep), steps/compare/sweep.py


def stage_order(st: Store, wanted: list[str] | None) -> list[str]:
    """The stages to show: `wanted`, else every stage experiment in the store, in DAG order
    (steps.presentation.STAGE_ORDER; stages it does not name follow, by experiment id)."""
    from steps.presentation import STAGE_ORDER

    have = [s for s in st.experiments if s != vs.LAB]
    if not have:
        raise CompareError(f"the store {st.uri} has no n00bgpt/<stage> experiments: run the DAG first")
    unknown = [s for s in wanted or [] if s not in have]
    if unknown:
        raise CompareError(f"unknown stage {', '.join(unknown)}: the store {st.uri} has runs of {', '.join(have)}")
    rank = {s: i for i, s in enumerate(STAGE_ORDER)}
    ordered = sorted(have, key=lambda s: (rank.get(s, len(rank)), int(st.experiments[s])))
    return [s for s in ordered if s in wanted] if wanted else ordered


def compare(stages: list[str] | None = None, uri: str | None = None, **options) -> str:
    """The stages' tables as one text in `fmt` (Options' fields are the keyword arguments)."""
    opts = Options(stages=stages, **options)
    if opts.fmt not in FORMATS:
        raise CompareError(f"--format {opts.fmt!r}: choose one of {', '.join(FORMATS)}")
    st = read(uri)
    if opts.sweep is not None:
        return sweep.sweeps_text(st, opts.sweep, opts)
    order = stage_order(st, opts.stages)
    if opts.vs:
        return versus(st, order, opts)
    tables, notes = {}, {}
    for stage in order:
        tables[stage], notes[stage] = stage_table(st, stage, opts)
    if opts.sort and all(opts.sort not in n.get("sorted", "") for n in notes.values()):
        raise CompareError(f"--sort {opts.sort}: no such metric or param in {', '.join(order)}")
    which = "latest run per cell" if opts.latest else "all runs"
    titles = {s: f"{s}: {len(tables[s])} run(s), {which}" for s in order}
    return render(tables, {s: n["lines"] for s, n in notes.items()}, titles, opts)


def stage_table(st: Store, stage: str, opts: Options):
    """(one stage's table, {'lines': notes under it, 'sorted': the key it is sorted by})."""
    from steps.tracking.describe import ui_url

    jobs = job_runs(st.of(stage))
    runs = frame(latest_per_cell(jobs) if opts.latest else jobs, link=lambda e, r: ui_url(opts.ui, e, r))
    metrics = stage_metrics(stage, opts.metrics, {c.removeprefix("metrics.") for c in runs if c.startswith("metrics.")})
    note = {"lines": [], "sorted": ""}
    if opts.sort:
        ordered = sort_runs(runs, opts.sort, metrics, opts.descending)
        if ordered is not None:
            runs, note["sorted"] = ordered, opts.sort
    table, same = build_table(runs, metrics, opts.only_changed, combine=opts.fmt in ("table", "markdown"))
    if opts.fmt == "table":
        table = table.drop(columns=["link"], errors="ignore")
        note["lines"].append(f"{same} param(s) equal in every row; runs: {ui_url(opts.ui, st.experiments[stage])}")
    elif opts.fmt == "markdown":
        table["run"] = [f"[{r}]({link})" for r, link in zip(table["run"], table.pop("link"))]
        note["lines"].append(f"{same} param(s) equal in every row.")
    return table, note


def render(tables: dict, notes: dict, titles: dict, opts: Options, extra: dict | None = None) -> str:
    """The stages' tables in `opts.fmt`."""
    if opts.fmt == "csv":
        return formats.as_csv(tables)
    if opts.fmt == "json":
        return formats.as_json(tables, extra)
    if opts.fmt == "markdown":
        return "\n".join(formats.markdown_block(titles[s], t, notes[s]) for s, t in tables.items())
    return "\n\n".join(formats.text_block(titles[s], t, notes[s], opts.width) for s, t in tables.items())


def versus(st: Store, order: list[str], opts: Options) -> str:
    """--vs: per stage, each cell's numbers as of the lab run `opts.lab` against those as of `opts.vs`,
    what changed first (vs.MOVES) and why (its changed params) before its numbers. To read (table,
    markdown): only the stages, cells and metrics that changed, unless `--all` (`opts.latest` off), which
    shows every stage, those with a change first; csv and json hold every stage and cell."""
    labs = vs.lab_runs(st.of(vs.LAB))
    this = vs.pick(labs, opts.lab)
    prev = vs.pick(labs, opts.vs, than=this)
    readable, everything = opts.fmt in ("table", "markdown"), not opts.latest
    tables, notes, titles, still, moves = {}, {}, {}, [], {}
    for stage in order:
        jobs = job_runs(st.of(stage))
        logged = {k for r in jobs for k in r["metrics"]}
        metrics = without_interval_ends(stage_metrics(stage, opts.metrics, logged))  # they feed the noise mark
        raw = vs.changed_first(vs.stage_changes(jobs, this, prev, metrics))
        changed = vs.moved(raw)
        moves[stage] = len(changed)
        if readable and not everything and changed.empty:
            still.append(stage)
            continue
        shown = raw if everything or not readable else changed
        only_changed = opts.only_changed or (readable and not everything)
        metrics = vs.keep_changed(shown, metrics) if only_changed else vs.drop_empty(shown, metrics)
        tables[stage] = vs.as_text(shown, metrics) if readable else vs.as_raw(shown, metrics)
        hidden = len(raw) - len(shown)
        titles[stage] = f"{stage}: {len(changed)} of {len(raw)} cell(s) rerun since {prev['run_id'][:8]}" + (
            f" ({hidden} unchanged not shown)" if hidden else ""
        )
        marked = shown[[f"{t} noise" for t in metrics]].notna().any().any() if len(shown) and metrics else False
        notes[stage] = [vs.LEGEND] if marked and readable else []
    if everything:  # the stages with a change first, each group in DAG order
        tables = {s: tables[s] for s in sorted(tables, key=lambda s: moves[s] == 0)}
    extra = {"lab_run": this["run_id"], "vs": prev["run_id"]}
    body = render(tables, notes, titles, opts, extra)
    if not readable:
        return body
    legend = vs.ORDER + (", then unchanged; stages with a change first" if everything else "")
    if still:
        legend += f"\nno change in {len(still)} stage(s): {', '.join(still)} (--all shows every stage and cell)"
    if not tables:
        body = "nothing changed" if opts.fmt == "table" else "Nothing changed.\n"
    return f"{vs.title(this, prev)}\n{legend}\n\n{body}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m steps.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", action="append", help="a stage (repeatable, or a,b) (default: every stage)")
    ap.add_argument("--sort", metavar="METRIC", help="sort the rows by a metric (title or key) or param leaf")
    ap.add_argument("--sort-order", choices=("asc", "desc"), default="asc", help="(default: %(default)s)")
    ap.add_argument(
        "--only-changed", "--diff", action="store_true", help="also hide the metrics equal in every row (default: off)"
    )
    ap.add_argument("--format", choices=FORMATS, default="table", dest="fmt", help="(default: %(default)s)")
    ap.add_argument(
        "--all",
        action="store_true",
        help="every run, not only the latest of each cell; with --vs: every stage and cell, not only what changed "
        "(default: off)",
    )
    ap.add_argument("--metrics", help="comma-separated metric keys (default: the stage's report columns)")
    ap.add_argument("--vs", metavar="previous|RUN", help="the changes since an earlier lab run: 'previous' or its id")
    ap.add_argument("--lab", metavar="RUN", help="the lab run --vs compares (default: the latest)")
    ap.add_argument("--sweep", nargs="?", const="", metavar="KEY", help="a sweep's runs by value (no KEY: every sweep)")
    ap.add_argument("--ui", default="", help="the UI's address for run links (default: relative to the UI's base)")
    ap.add_argument("--tracking-uri", help="(default: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db)")
    args = ap.parse_args(argv)
    split = [s.strip() for arg in args.stage for s in arg.split(",") if s.strip()] if args.stage else None
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    opts = dict(
        only_changed=args.only_changed,
        latest=not args.all,
        metrics=metrics,
        sort=args.sort,
        descending=args.sort_order == "desc",
        fmt=args.fmt,
        width=shutil.get_terminal_size((120, 24)).columns,
        vs=args.vs,
        lab=args.lab,
        ui=args.ui,
        sweep=args.sweep,
    )
    try:
        print(compare(split, args.tracking_uri, **opts))
    except CompareError as exc:
        sys.exit(f"steps.compare: {exc}")
    except BrokenPipeError:  # `| head`: the reader has what it wanted; no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
