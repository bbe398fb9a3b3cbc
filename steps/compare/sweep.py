"""`--sweep [KEY]`: a swept knob's runs (steps/config/sweep.py: job runs tagged `sweep=<key>`) as one
table per sweep, one row per value in value order (the latest run of each sweep cell): the value,
the cell, its status and seeds, the stage's metrics with their seed intervals ('mean [low, high]
(n seeds)'), the params that differ (the swept knob among them), run, start. Without KEY every
sweep in the store, the newest first.
"""

from __future__ import annotations

import io
import json

import pandas as pd

from steps.compare import formats
from steps.compare.read import CompareError, Store
from steps.compare.table import build_table, frame, job_runs, latest_per_cell, stage_metrics


def swept(st: Store) -> dict[str, list[dict]]:
    """{sweep key: its job runs, oldest first}, the sweep run last first."""
    found: dict[str, list[dict]] = {}
    for stage in st.experiments:
        for r in job_runs(st.of(stage)):
            if r["tags"].get("sweep"):
                found.setdefault(r["tags"]["sweep"], []).append(r)
    newest = sorted(found, key=lambda k: max(r["start"] for r in found[k]), reverse=True)
    return {k: sorted(found[k], key=lambda r: (r["start"], r["run_id"])) for k in newest}


def order(run: dict) -> tuple:
    """A run's place in its sweep: `sweep_order` (the value's rank when its sweep ran), then the value."""
    value = run["tags"].get("sweep_value", "")
    try:
        number = float(value)
    except ValueError:
        number = float("inf")
    return (number, run["tags"].get("sweep_order", ""), value)


def sweep_table(runs: list[dict], link=None, only_changed: bool = False, combine: bool = True) -> pd.DataFrame:
    """One sweep's rows in value order (module docstring)."""
    latest = sorted(latest_per_cell(runs), key=order)
    stage = latest[0]["tags"].get("stage", "") if latest else ""
    table = frame(latest, link=link)
    logged = {c.removeprefix("metrics.") for c in table if c.startswith("metrics.")}
    metrics = stage_metrics(stage, None, logged)
    out, _ = build_table(table, metrics, only_changed, combine=combine)
    out.insert(0, "value", [r["tags"].get("sweep_value", "") for r in latest])
    return out


def sweeps_text(st: Store, key: str, opts) -> str:
    """The sweeps' tables in `opts.fmt` (steps/compare/__init__.py's Options)."""
    from steps.tracking.describe import ui_url

    found = swept(st)
    if not found:
        raise CompareError(
            f"the store {st.uri} has no sweep runs: run one, e.g. "
            "`snakemake --cores 2 --configfile configs/sweeps/mcq_lr.yaml`"
        )
    if key and key not in found:
        raise CompareError(f"no sweep {key!r} in the store {st.uri}; its sweeps: {', '.join(found)}")
    keys = [key] if key else list(found)
    tables = {}
    for k in keys:
        tables[k] = sweep_table(
            found[k],
            link=lambda e, r: ui_url(opts.ui, e, r),
            only_changed=opts.only_changed,
            combine=opts.fmt in ("table", "markdown"),
        )
    if opts.fmt == "json":
        return json.dumps({"sweeps": {k: formats.records(t) for k, t in tables.items()}}, indent=1, ensure_ascii=False)
    if opts.fmt == "csv":
        buf = io.StringIO()
        pd.concat([t.assign(sweep=k)[["sweep", *t.columns]] for k, t in tables.items()]).to_csv(buf, index=False)
        return buf.getvalue()
    blocks = []
    for k, t in tables.items():
        stage = found[k][0]["tags"].get("stage", "?")
        title = f"sweep {k}: {len(t)} value(s) of {stage}, latest run per cell, in value order"
        if opts.fmt == "markdown":
            t = t.assign(run=[f"[{r}]({link})" for r, link in zip(t["run"], t.pop("link"))])
            blocks.append(formats.markdown_block(title, t, []))
        else:
            blocks.append(formats.text_block(title, t.drop(columns=["link"], errors="ignore"), [], opts.width))
    return ("\n" if opts.fmt == "markdown" else "\n\n").join(blocks)
