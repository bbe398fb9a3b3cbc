"""The report's numbers: each cell's record (metrics.json, or why there is none), this DAG's runs
from MLflow, and one table per stage shaped by its presentation (columns, derived, headline)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd

from steps.core.errors import InputError
from steps.core.stage import Presentation
from steps.tables import fmt


def read_record(path: Path) -> dict:
    """A job's metrics.json or failed.json; one that cannot be read stops the report with one line
    naming it (never a report built from a broken file; a plain rerun redoes its job)."""
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable or not valid JSON ({exc}); rerun `snakemake` to redo its job") from None
    if not isinstance(record, dict):
        raise InputError(f"{path}: not a JSON object; rerun `snakemake` to redo its job")
    return record


def load_cell(metrics: Path, stage: str, cell: str) -> dict:
    """metrics.json of a cell, or a record explaining why there is none."""
    if metrics.exists():
        return read_record(metrics)
    failed = metrics.with_name("failed.json")
    if failed.exists():
        rec = read_record(failed)
        return {**rec, "status": "failed", "reason": rec.get("error", "failed")}
    return {
        "stage": stage,
        "cell": cell,
        "status": "missing",
        "reason": "not run (no metrics.json)",
        "metrics": {},
        "info": {},
    }


def fetch_runs(client, run_ids: list[str]) -> pd.DataFrame:
    """This DAG's runs from MLflow, indexed by run id."""
    ids = sorted({r for r in run_ids if r})
    if not ids:
        return pd.DataFrame()
    exps = [e.experiment_id for e in client.search_experiments()]
    frames = []
    for i in range(0, len(ids), 50):  # keep each filter string short
        chunk = ", ".join(f"'{r}'" for r in ids[i : i + 50])
        frames.append(
            mlflow.search_runs(
                experiment_ids=exps, output_format="pandas", filter_string=f"attributes.run_id IN ({chunk})"
            )
        )
    return pd.concat(frames, ignore_index=True).set_index("run_id")


def lookup(ref: str, rec: dict, run: pd.Series | None):
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


def derive(table: pd.DataFrame, derived: dict) -> pd.DataFrame:
    for title, (how, column, ref_cell) in (derived or {}).items():
        ref = table.loc[table["cell"] == ref_cell, column] if column in table else pd.Series(dtype=float)
        base = pd.to_numeric(ref, errors="coerce").dropna()
        values = pd.to_numeric(table.get(column), errors="coerce")
        if base.empty or values is None:
            table[title] = None
            continue
        table[title] = values / base.iloc[0] if how == "ratio" else values - base.iloc[0]
    return table


def stage_table(records: dict[str, dict], runs: pd.DataFrame, stage: Presentation) -> pd.DataFrame:
    """One row per declared cell from its record (`load_cell`) and its MLflow run."""
    rows = []
    for cell, rec in records.items():
        run_id = rec.get("run_id")
        run = runs.loc[run_id] if run_id and len(runs) and run_id in runs.index else None
        row = {"cell": cell, "status": rec.get("status"), "reason": rec.get("reason", "")}
        row |= {t: lookup(ref, rec, run) for t, ref in stage.columns.items()}
        row["experiment_id"] = rec.get("experiment_id") or ""
        row["run_id"] = run_id or ""
        rows.append(row)
    return derive(pd.DataFrame(rows), stage.derived)


def headline(table: pd.DataFrame, stage: Presentation) -> tuple[str, str, str]:
    """(label, value text, run id) of the index line: the best ok row by the stage's headline
    column, among the rows `headline_if` admits; `headline_none` when none qualifies."""
    spec = stage.headline
    ok = table[table["status"] == "ok"]
    if not spec or spec[1] not in table or ok.empty:
        return "", "", ""
    label, column, pick = spec
    if stage.headline_if:
        cond_col, wanted = stage.headline_if
        ok = ok[ok[cond_col] == wanted] if cond_col in ok else ok.iloc[0:0]
    values = pd.to_numeric(ok[column], errors="coerce")
    if values.dropna().empty:
        return label, stage.headline_none, ""
    i = values.idxmax() if pick == "max" else values.idxmin()
    text = fmt(float(values[i]))
    if stage.headline_interval:
        low, high = (ok.loc[i, c] if c in ok else None for c in stage.headline_interval)
        text += f" [{fmt(low)}, {fmt(high)}]"
    if stage.headline_of and stage.headline_of[0] in ok:
        count = pd.to_numeric(pd.Series([ok.loc[i, stage.headline_of[0]]]), errors="coerce")[0]
        text += f" on {count:,.0f} {stage.headline_of[1]}" if pd.notna(count) else ""
    return label, f"{text} ({ok.loc[i, 'cell']})", ok.loc[i, "run_id"]


def headline_row(stage: str, table: pd.DataFrame, spec: Presentation) -> dict:
    """The stage's line of the headline table: its cells by status, the key number, its run."""
    status = table["status"].value_counts().to_dict()
    label, value, run_id = headline(table, spec)
    exp = table.loc[table["run_id"] == run_id, "experiment_id"].iloc[0] if run_id else ""
    return {
        "stage": stage,
        "cells": len(table),
        "ok": status.get("ok", 0),
        "skipped": status.get("skipped", 0),
        "failed/missing": status.get("failed", 0) + status.get("missing", 0),
        "key number": f"{label}: {value}" if value else "",
        "experiment_id": exp,
        "run_id": run_id,
    }


def logged_tables(folders: dict[str, Path], names) -> dict[str, pd.DataFrame]:
    """Tables the cells logged (`<cell folder>/<name>.csv`), stacked with a `cell` column."""
    out = {}
    for name in names or []:
        frames = []
        for cell, folder in folders.items():
            f = folder / f"{name}.csv"
            if f.exists():
                frames.append(pd.read_csv(f).assign(cell=cell))
        if frames:
            out[name] = pd.concat(frames, ignore_index=True)
    return out
