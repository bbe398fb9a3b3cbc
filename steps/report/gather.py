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


# A column whose cells trained seed groups carries its interval in a companion column, "<title>" +
# SEEDS ("[low, high] (n seeds)"): the CSV keeps both, the rendered tables show "mean [low, high]
# (n seeds)" in one cell (render.py); VERDICT follows a derived column where seeds decide it.
SEEDS = " · 95 % over seeds"
VERDICT = " · beyond noise?"


def seed_interval(rec: dict, ref: str) -> tuple[float, float, int] | None:
    """(low, high, seeds) of a `metrics.<key>` column where the cell trained 2+ seeds; None else."""
    kind, _, key = ref.partition(".")
    m = rec.get("metrics") or {}
    low, high, n = m.get(f"{key}_low"), m.get(f"{key}_high"), m.get("seeds") or 1
    # `_sd` with them: a seed group's (a paired timing's `_low`/`_high` has none)
    if kind != "metrics" or low is None or high is None or m.get(f"{key}_sd") is None or n < 2:
        return None
    return float(low), float(high), int(n)


def seed_values(folders: dict[str, Path] | None) -> dict[str, pd.DataFrame]:
    """Each cell's per-seed outcomes (`<cell folder>/seeds.csv`, written by a seed group), by cell."""
    out = {}
    for cell, folder in (folders or {}).items():
        f = Path(folder) / "seeds.csv"
        if f.exists():
            try:
                out[cell] = pd.read_csv(f)
            except (OSError, ValueError, pd.errors.ParserError):
                continue
    return out


def difference_verdict(
    table: pd.DataFrame, column: str, cell: str, ref_cell: str, key: str | None, seeds
) -> str | None:
    """Is `cell`'s `column` above or below `ref_cell`'s beyond seed noise? Paired over the seeds the
    two cells share (their seeds.csv), else by their intervals; None where neither has an interval."""
    from steps.core.seeds import compare, verdict_of_intervals

    names = {"a better": "higher", "b better": "lower"}
    if cell == ref_cell:
        return None
    a, b = seeds.get(cell), seeds.get(ref_cell)
    if key and a is not None and b is not None and key in a and key in b:
        shared = a[["seed", key]].merge(b[["seed", key]], on="seed", suffixes=("_a", "_b")).dropna()
        if len(shared) >= 2:
            return names.get(v := compare(shared[f"{key}_a"].tolist(), shared[f"{key}_b"].tolist(), paired=True), v)
    ends = [table.loc[table["cell"] == c, column + SEEDS] for c in (cell, ref_cell)] if column + SEEDS in table else []
    iv = [parse_interval(e.iloc[0]) if len(e) else None for e in ends]
    if len(iv) == 2 and all(iv):
        return names.get(v := verdict_of_intervals(iv[0], iv[1]), v)
    return None


def parse_interval(text) -> tuple[float, float] | None:
    """(low, high) of a SEEDS cell, "[low, high] (n seeds)"."""
    if not isinstance(text, str) or not text.startswith("["):
        return None
    low, _, high = text[1:].partition("]")[0].partition(", ")
    try:
        return float(low), float(high)
    except ValueError:
        return None


def derive(table: pd.DataFrame, derived: dict, columns: dict | None = None, seeds: dict | None = None) -> pd.DataFrame:
    """Each derived column (a ratio to, or difference from, a reference cell's value), and where the
    cells trained seed groups its verdict: "higher"/"lower" beyond seed noise, or "not decided"."""
    for title, (how, column, ref_cell) in (derived or {}).items():
        ref = table.loc[table["cell"] == ref_cell, column] if column in table else pd.Series(dtype=float)
        base = pd.to_numeric(ref, errors="coerce").dropna()
        values = pd.to_numeric(table.get(column), errors="coerce")
        if base.empty or values is None:
            table[title] = None
            continue
        table[title] = values / base.iloc[0] if how == "ratio" else values - base.iloc[0]
        ref_key = (columns or {}).get(column, "").partition(".")
        key = ref_key[2] if ref_key[0] == "metrics" else None
        verdicts = [difference_verdict(table, column, c, ref_cell, key, seeds or {}) for c in table["cell"]]
        if any(v is not None for v in verdicts):
            table[title + VERDICT] = verdicts
    return table


def stage_table(
    records: dict[str, dict], runs: pd.DataFrame, stage: Presentation, folders: dict[str, Path] | None = None
) -> pd.DataFrame:
    """One row per declared cell from its record (`load_cell`) and its MLflow run; a seed group's
    columns with their interval beside them (SEEDS); `folders` (each cell's) for the per-seed
    outcomes that decide derived verdicts paired."""
    rows = []
    for cell, rec in records.items():
        run_id = rec.get("run_id")
        run = runs.loc[run_id] if run_id and len(runs) and run_id in runs.index else None
        row = {"cell": cell, "status": rec.get("status"), "reason": rec.get("reason", "")}
        for t, ref in stage.columns.items():
            row[t] = lookup(ref, rec, run)
            if (iv := seed_interval(rec, ref)) is not None:
                row[t + SEEDS] = f"[{fmt(iv[0])}, {fmt(iv[1])}] ({iv[2]} seeds)"
        row["experiment_id"] = rec.get("experiment_id") or ""
        row["run_id"] = run_id or ""
        rows.append(row)
    table = pd.DataFrame(rows)
    order = [c for t in stage.columns for c in (t, t + SEEDS) if c in table]
    table = table[["cell", "status", "reason", *order, "experiment_id", "run_id"]]
    return derive(table, stage.derived, dict(stage.columns), seed_values(folders))


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
    seeded = ok.loc[i, column + SEEDS] if column + SEEDS in ok else None
    against = ""
    if isinstance(seeded, str) and seeded:
        text += f" {seeded}"
        against = runner_up(ok, values, i, column, pick)
    elif column + SEEDS in ok:  # other cells of the stage trained seed groups, this one did not
        text += " (1 seed: no interval)"
    if stage.headline_of and stage.headline_of[0] in ok:
        count = pd.to_numeric(pd.Series([ok.loc[i, stage.headline_of[0]]]), errors="coerce")[0]
        text += f" on {count:,.0f} {stage.headline_of[1]}" if pd.notna(count) else ""
    return label, f"{text} ({ok.loc[i, 'cell']}){against}", ok.loc[i, "run_id"]


def runner_up(ok: pd.DataFrame, values: pd.Series, best, column: str, pick: str) -> str:
    """'; ahead of <cell> beyond seed noise' / '; not decided against <cell>': the best row against the
    next best by the two cells' seed intervals (overlapping intervals: not decided)."""
    from steps.core.seeds import NOT_DECIDED, verdict_of_intervals

    rest = values.drop(index=best).dropna()
    if rest.empty:
        return ""
    j = rest.idxmax() if pick == "max" else rest.idxmin()
    a, b = (parse_interval(ok.loc[k, column + SEEDS]) for k in (best, j))
    other = ok.loc[j, "cell"]
    if a is None or b is None:
        return f"; not decided against {other} (it has no seed interval)"
    verdict = verdict_of_intervals(a, b, higher_is_better=pick == "max")
    if verdict == NOT_DECIDED:
        return f"; not decided against {other} (the seed intervals overlap)"
    return f"; ahead of {other} beyond seed noise"


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
