"""report: the DAG's final target — the comparison tables and plots people came for.

Which runs belong to this DAG is known exactly: each job's metrics.json names its MLflow run id.
Numbers are read back from MLflow (`mlflow.search_runs`), so the report shows what the tracking
store holds, and every row links to its run. Declared cells that are missing, skipped or failed
appear with their reason; `<stage>.select` (or `--config`) narrows the tables with the matrix.

A stage shapes its section with optional module-level hooks (all cheap to import):
  REPORT_COLUMNS  {"title": "metrics.<key>" | "info.<key>" | "params.<key>"}   one row per cell
  REPORT_DERIVED  {"title": ("ratio" | "diff", "<column title>", "<reference cell>")}
  REPORT_HEADLINE ("what the number is", "<column title>", "max" | "min")    the index line
  REPORT_CURVES   ["<metric key with steps>", ...]        plotted per cell from MLflow history
  REPORT_TABLES   ["<name>", ...]      tables the cells logged (results/<stage>/<cell>/<name>.csv)
  report_figures(table, out_dir) -> [png paths]           stage-specific plots
"""
from __future__ import annotations

import base64
import html
import importlib
import json
from pathlib import Path

import pandas as pd

from steps import paths
from steps.tables import fmt, to_markdown
from steps.tracking import StageRun, stage_main, store

REPORT_COLUMNS = {"ok": "metrics.cells_ok", "skipped": "metrics.cells_skipped",
                  "failed": "metrics.cells_failed", "missing": "metrics.cells_missing"}


# ---- gathering -------------------------------------------------------------------------------
def load_cell(stage: str, cell: str) -> dict:
    """metrics.json of a cell, or a record explaining why there is none."""
    ok = paths.metrics_path(stage, cell)
    if ok.exists():
        return json.loads(ok.read_text())
    failed = ok.with_name("failed.json")
    if failed.exists():
        rec = json.loads(failed.read_text())
        return {**rec, "status": "failed", "reason": rec.get("error", "failed")}
    return {"stage": stage, "cell": cell, "status": "missing", "reason": "not run (no metrics.json)",
            "metrics": {}, "info": {}}


def fetch_runs(client, run_ids: list[str]) -> pd.DataFrame:
    """This DAG's runs from MLflow, indexed by run id."""
    import mlflow

    ids = sorted({r for r in run_ids if r})
    if not ids:
        return pd.DataFrame()
    exps = [e.experiment_id for e in client.search_experiments()]
    frames = []
    for i in range(0, len(ids), 50):  # keep each filter string short
        chunk = ", ".join(f"'{r}'" for r in ids[i:i + 50])
        frames.append(mlflow.search_runs(experiment_ids=exps, output_format="pandas",
                                         filter_string=f"attributes.run_id IN ({chunk})"))
    return pd.concat(frames, ignore_index=True).set_index("run_id")


def hooks(stage: str) -> dict:
    try:
        module = importlib.import_module(f"steps.{stage}")
    except ImportError:
        module = None
    names = ("REPORT_COLUMNS", "REPORT_DERIVED", "REPORT_HEADLINE", "REPORT_CURVES", "REPORT_TABLES",
             "report_figures")
    return {n: getattr(module, n, None) for n in names}


def _lookup(ref: str, rec: dict, run: pd.Series | None):
    """`metrics.x` from MLflow (metrics.json as fallback), `info.x` from metrics.json."""
    kind, _, key = ref.partition(".")
    if kind == "metrics":
        col = f"metrics.{key}"
        if run is not None and col in run.index and pd.notna(run[col]):
            return float(run[col])
        return rec.get("metrics", {}).get(key)
    if kind == "info":
        value = rec.get("info", {}).get(key)
        return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    if kind == "params" and run is not None:
        return run.get(f"params.{key}")
    return None


def _derive(table: pd.DataFrame, derived: dict) -> pd.DataFrame:
    for title, (how, column, ref_cell) in (derived or {}).items():
        ref = table.loc[table["cell"] == ref_cell, column] if column in table else pd.Series(dtype=float)
        base = pd.to_numeric(ref, errors="coerce").dropna()
        values = pd.to_numeric(table.get(column), errors="coerce")
        if base.empty or values is None:
            table[title] = None
            continue
        table[title] = values / base.iloc[0] if how == "ratio" else values - base.iloc[0]
    return table


def stage_table(records: dict[str, dict], runs: pd.DataFrame, hook: dict) -> pd.DataFrame:
    """One row per declared cell from its record (`load_cell`) and its MLflow run."""
    rows = []
    for cell, rec in records.items():
        run_id = rec.get("run_id")
        run = runs.loc[run_id] if run_id and len(runs) and run_id in runs.index else None
        row = {"cell": cell, "status": rec.get("status"), "reason": rec.get("reason", "")}
        row |= {t: _lookup(ref, rec, run) for t, ref in (hook["REPORT_COLUMNS"] or {}).items()}
        row["experiment_id"] = rec.get("experiment_id") or ""
        row["run_id"] = run_id or ""
        rows.append(row)
    return _derive(pd.DataFrame(rows), hook["REPORT_DERIVED"])


def headline(stage: str, table: pd.DataFrame, hook: dict) -> tuple[str, str, str]:
    spec = hook["REPORT_HEADLINE"]
    ok = table[table["status"] == "ok"]
    if not spec or spec[1] not in table or ok.empty:
        return "", "", ""
    label, column, pick = spec
    values = pd.to_numeric(ok[column], errors="coerce")
    if values.dropna().empty:
        return label, "", ""
    i = values.idxmax() if pick == "max" else values.idxmin()
    return label, f"{fmt(float(values[i]))} ({ok.loc[i, 'cell']})", ok.loc[i, "run_id"]


# ---- plots -----------------------------------------------------------------------------------
def curve_figure(stage: str, table: pd.DataFrame, keys: list[str], client, out: Path) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table[(table["status"] == "ok") & (table["run_id"] != "")]
    if ok.empty or not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.5), squeeze=False)
    drawn = False
    for ax, key in zip(axes[0], keys):
        for _, row in ok.iterrows():
            hist = store.retrying(client.get_metric_history, row["run_id"], key)
            if len(hist) > 1:
                hist = sorted(hist, key=lambda m: m.step)
                ax.plot([m.step for m in hist], [m.value for m in hist], label=row["cell"])
                drawn = True
        ax.set_title(f"{stage}: {key}")
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return None
    path = out / f"{stage}_curves.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def logged_tables(stage: str, cells: list[str], names: list[str]) -> dict[str, pd.DataFrame]:
    out = {}
    for name in names or []:
        frames = []
        for cell in cells:
            f = paths.stage_dir(stage, cell) / f"{name}.csv"
            if f.exists():
                frames.append(pd.read_csv(f).assign(cell=cell))
        if frames:
            out[name] = pd.concat(frames, ignore_index=True)
    return out


# ---- rendering -------------------------------------------------------------------------------
def run_link(ui: str, exp: str, run_id: str) -> str:
    return f"{ui.rstrip('/')}/#/experiments/{exp}/runs/{run_id}" if run_id else ""


def md_with_links(table: pd.DataFrame, ui: str) -> str:
    shown = table.drop(columns=["experiment_id"]).copy()
    shown["run_id"] = [f"[{r[:8]}]({run_link(ui, e, r)})" if r else ""
                       for r, e in zip(table["run_id"], table["experiment_id"])]
    return to_markdown(shown)


def html_table(table: pd.DataFrame, ui: str) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns if c != "experiment_id")
    body = []
    for _, row in table.iterrows():
        cells = []
        for c in table.columns:
            if c == "experiment_id":
                continue
            v = row[c]
            if c == "run_id" and v:
                cells.append(f'<td><a href="{run_link(ui, row["experiment_id"], v)}">{v[:8]}</a></td>')
            else:
                cells.append(f"<td>{html.escape(fmt(v))}</td>")
        body.append(f'<tr class="{html.escape(str(row.get("status", "")))}">{"".join(cells)}</tr>')
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def embed(png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return f'<p><img alt="{png.stem}" src="data:image/png;base64,{data}"></p>'


CSS = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
       "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;"
       "padding:3px 7px;text-align:right}th{background:#f0f0f0}tr.failed,tr.missing{background:#fdd}"
       "tr.skipped{background:#ffd}img{max-width:100%}")


def run(ctx: StageRun) -> dict:
    p = ctx.params
    stages = {stage: {"cells": stage_cells} for stage, stage_cells in p.get("stages", [])}  # DAG order
    ui = p.get("mlflow_ui_url", "http://127.0.0.1:5000")
    out, plots = ctx.out, ctx.out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    client = store.client(ctx.uri)
    records = {s: {c: load_cell(s, c) for c in spec["cells"]} for s, spec in stages.items()}
    run_ids = [rec.get("run_id") for recs in records.values() for rec in recs.values()]
    runs = fetch_runs(client, run_ids)

    heads, md_sections, html_sections = [], [], []
    counts = {"ok": 0, "skipped": 0, "failed": 0, "missing": 0}
    for stage, spec in ctx.progress(stages.items(), desc="report", total=len(stages)):
        hook = hooks(stage)
        table = stage_table(records[stage], runs, hook)
        table.to_csv(out / f"{stage}.csv", index=False)
        status = table["status"].value_counts().to_dict()
        for k in counts:
            counts[k] += int(status.get(k, 0))
        label, value, run_id = headline(stage, table, hook)
        exp = table.loc[table["run_id"] == run_id, "experiment_id"].iloc[0] if run_id else ""
        heads.append({"stage": stage, "cells": len(table), "ok": status.get("ok", 0),
                      "skipped": status.get("skipped", 0),
                      "failed/missing": status.get("failed", 0) + status.get("missing", 0),
                      "key number": f"{label}: {value}" if value else "", "experiment_id": exp,
                      "run_id": run_id})
        figs = [f for f in [curve_figure(stage, table, hook["REPORT_CURVES"] or [], client, plots)] if f]
        if hook["report_figures"]:
            figs += [Path(f) for f in hook["report_figures"](table, plots) or []]
        extra = logged_tables(stage, spec["cells"], hook["REPORT_TABLES"])
        md = f"## {stage}\n\n" + md_with_links(table, ui)
        md += "".join(f"\n### {stage}: {name}\n\n{to_markdown(df)}" for name, df in extra.items())
        md += "".join(f"\n![{f.stem}](plots/{f.name})\n" for f in figs)
        (out / f"{stage}.md").write_text(md)
        md_sections.append(md)
        html_sections.append(f"<h2 id='{stage}'>{stage}</h2>" + html_table(table, ui)
                             + "".join(f"<h3>{stage}: {html.escape(n)}</h3>{df.to_html(index=False)}"
                                       for n, df in extra.items())
                             + "".join(embed(f) for f in figs))
        for f in figs:
            ctx.log_artifact(f, "plots")
        ctx.log_artifact(out / f"{stage}.csv", "tables")

    head = pd.DataFrame(heads)
    if head.empty:
        head = pd.DataFrame(columns=["stage", "cells", "ok", "skipped", "failed/missing",
                                     "key number", "experiment_id", "run_id"])
    title = p.get("title", "n00bGPT lab report")
    intro = (f"# {title}\n\nEvery row links to its MLflow run (serve the store with "
             f"`python -m steps.ui`, then open {ui}).\n\n")
    (out / "index.md").write_text(intro + "## Headline\n\n" + md_with_links(head, ui) + "\n"
                                  + "\n".join(md_sections))
    (out / "index.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1><h2>Headline</h2>"
        + html_table(head, ui) + "".join(html_sections) + "</body></html>")
    for name in ("index.md", "index.html"):
        ctx.log_artifact(out / name)
    return {f"cells_{k}": v for k, v in counts.items()}


if __name__ == "__main__":
    stage_main("report", run)
