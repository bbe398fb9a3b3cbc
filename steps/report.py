"""report: the DAG's final target — one table per stage, built from this DAG's runs.

Which runs belong to this DAG is known exactly: each job's metrics.json names its MLflow run id.
Numbers in the tables are read back from MLflow (`mlflow.search_runs`), so the report shows what
the tracking server holds; declared cells that are missing, skipped or failed appear with their
reason. A stage shapes its table with a module-level `REPORT_COLUMNS` and may add figures with a
`report_figures(table, out_dir) -> list[Path]` function.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pandas as pd

from steps import paths
from steps.tables import to_markdown
from steps.tracking import StageRun, stage_main
from steps.tracking import store

REPORT_COLUMNS: dict[str, str] = {}


def load_cell(stage: str, cell: str) -> dict:
    """metrics.json of a cell, or a record explaining why it is missing."""
    ok = paths.metrics_path(stage, cell)
    if ok.exists():
        return json.loads(ok.read_text())
    failed = ok.with_name("failed.json")
    if failed.exists():
        rec = json.loads(failed.read_text())
        return {**rec, "status": "failed", "reason": rec.get("error", "failed")}
    return {"stage": stage, "cell": cell, "status": "missing", "reason": "not run (no metrics.json)",
            "metrics": {}, "info": {}}


def fetch_runs(run_ids: list[str], uri: str | None) -> pd.DataFrame:
    """The runs of this DAG from MLflow, one row per run id."""
    import mlflow

    ids = [r for r in run_ids if r]
    if not ids:
        return pd.DataFrame()
    client = store.client(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    frames = []
    for i in range(0, len(ids), 50):  # keep the filter string short
        chunk = ", ".join(f"'{r}'" for r in ids[i:i + 50])
        frames.append(mlflow.search_runs(experiment_ids=exps, filter_string=f"attributes.run_id IN ({chunk})",
                                         output_format="pandas"))
    runs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return runs.set_index("run_id") if len(runs) else runs


def _lookup(ref: str, rec: dict, run: pd.Series | None):
    """`metrics.x` from MLflow (falling back to metrics.json), `info.x` from metrics.json."""
    kind, _, key = ref.partition(".")
    if kind == "metrics":
        if run is not None and f"metrics.{key}" in run.index and pd.notna(run[f"metrics.{key}"]):
            return float(run[f"metrics.{key}"])
        return rec.get("metrics", {}).get(key)
    if kind == "info":
        value = rec.get("info", {}).get(key)
        return ", ".join(map(str, value)) if isinstance(value, list) else value
    if kind == "params" and run is not None:
        return run.get(f"params.{key}")
    return None


def stage_columns(stage: str) -> dict[str, str]:
    try:
        module = importlib.import_module(f"steps.{stage}")
    except ImportError:
        return {}
    return getattr(module, "REPORT_COLUMNS", {})


def stage_table(stage: str, cells: list[str], runs: pd.DataFrame) -> pd.DataFrame:
    columns = stage_columns(stage)
    rows = []
    for cell in cells:
        rec = load_cell(stage, cell)
        run_id = rec.get("run_id")
        run = runs.loc[run_id] if run_id and len(runs) and run_id in runs.index else None
        row = {"cell": cell, "status": rec.get("status"), "reason": rec.get("reason", "")}
        row |= {title: _lookup(ref, rec, run) for title, ref in columns.items()}
        row["run_id"] = run_id or ""
        rows.append(row)
    return pd.DataFrame(rows)


def stage_figures(stage: str, table: pd.DataFrame, out: Path) -> list[Path]:
    module = importlib.import_module(f"steps.{stage}")
    fn = getattr(module, "report_figures", None)
    return list(fn(table, out) or []) if fn else []


def run(ctx: StageRun) -> dict:
    stages: dict[str, dict] = ctx.params.get("stages", {})
    out = ctx.out
    records = {s: [load_cell(s, c) for c in spec["cells"]] for s, spec in stages.items()}
    run_ids = [r.get("run_id") for recs in records.values() for r in recs]
    runs = fetch_runs(run_ids, ctx.uri)
    index = [f"# {ctx.params.get('title', 'n00bGPT lab report')}", "",
             "| stage | cells | ok | skipped | failed/missing |", "|---|---|---|---|---|"]
    sections, counts = [], {"ok": 0, "skipped": 0, "failed": 0, "missing": 0}
    for stage, spec in stages.items():
        table = stage_table(stage, spec["cells"], runs)
        csv = out / f"{stage}.csv"
        table.to_csv(csv, index=False)
        md = to_markdown(table)
        (out / f"{stage}.md").write_text(f"## {stage}\n\n{md}")
        ctx.log_artifact(csv, "tables")
        status = table["status"].value_counts().to_dict()
        for k in counts:
            counts[k] += int(status.get(k, 0))
        bad = int(status.get("failed", 0)) + int(status.get("missing", 0))
        index.append(f"| [{stage}]({stage}.md) | {len(table)} | {status.get('ok', 0)} | "
                     f"{status.get('skipped', 0)} | {bad} |")
        figs = stage_figures(stage, table, out)
        for f in figs:
            ctx.log_artifact(f, "plots")
        sections.append(f"## {stage}\n\n{md}\n" + "".join(f"\n![{f.stem}]({f.name})\n" for f in figs))
    text = "\n".join(index) + "\n\n" + "\n".join(sections)
    (out / "index.md").write_text(text)
    ctx.log_artifact(out / "index.md")
    return {f"cells_{k}": v for k, v in counts.items()}


if __name__ == "__main__":
    stage_main("report", run)
