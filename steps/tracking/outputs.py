"""Finished results that can no longer be trusted, found before Snakemake plans (the Snakefile calls
`set_aside`): a metrics.json that is unreadable, not valid JSON or names no MLflow run, and one whose
run is not in the store (the store was deleted or replaced under finished results). Snakemake sees
only that the file exists and is newer than its inputs, so it would keep it, and the report would
show its numbers with links to nothing. Each such file is moved aside to `metrics.json.broken`
(its bytes kept) with one line saying why, so Snakemake finds the output missing and redoes the job
and what consumes it. A dry run (`snakemake -n`) changes nothing: its lines say what a real run would
move aside and redo.

Cheap, so every plan can afford it: the files are small, and a local SQLite store's run ids are read
with sqlite3 directly (one query, read-only, no MLflow import). Any other store (an HTTP server, a
database server) is not queried here: its runs are checked by the jobs that log to it.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from steps.tracking.store import local_db, tracking_uri

SUFFIX = ".broken"


class BrokenStore(Exception):
    """The local store exists but its runs cannot be read: one line naming it and the fix."""


def store_runs(uri: str) -> set[str] | None:
    """The active run ids of a local SQLite store (empty when the file is missing or new), or None
    for a store this check does not read."""
    path = local_db(uri)
    if path is None:
        return None
    if not path.exists():
        return set()
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30) as con:
            rows = con.execute("SELECT run_uuid FROM runs WHERE lifecycle_stage = 'active'").fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # an empty file: a store not created yet
            return set()
        raise BrokenStore(f"{path}: cannot read its runs ({exc}); fix or move the file aside and rerun") from None
    except sqlite3.DatabaseError as exc:
        raise BrokenStore(f"{path}: not an MLflow SQLite store ({exc}); move it aside and rerun") from None
    return {run for (run,) in rows}


def problem(metrics: Path, runs: set[str] | None, store: str) -> str | None:
    """Why a finished job's metrics.json cannot be trusted, or None (missing files are Snakemake's)."""
    try:
        record = json.loads(metrics.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return f"not valid JSON ({exc})"
    if not isinstance(record, dict):
        return "not a JSON object"
    run = record.get("run_id")
    if not run:
        return "names no MLflow run (no run_id)"
    if runs is not None and run not in runs:
        return f"its MLflow run {run} is not in the store {store} (deleted or replaced?)"
    return None


def move_aside(path: Path, why: str) -> str:
    """Rename `path` to `<name>.broken` (its bytes kept); the line that says so."""
    aside = path.with_name(path.name + SUFFIX)
    try:
        os.replace(path, aside)
    except OSError as exc:
        raise OSError(f"{path}: {why}, and cannot be moved aside ({exc.strerror}); remove it and rerun") from None
    return f"{path}: {why}; moved to {aside.name}, its job is redone"


def would_move(path: Path, why: str) -> str:
    """A dry run's line for `path`: what a real run would do with it (nothing is moved)."""
    return f"{path}: {why}; a real run moves it to {path.name + SUFFIX} and redoes its job (a dry run moves nothing)"


def set_aside(metrics_files: list[str], configured_uri: str | None, final: str, dry_run: bool = False) -> list[str]:
    """Move every untrustworthy metrics.json among `metrics_files` to `<name>.broken`, one line per
    file (what was wrong, where it went). Snakemake reruns a job whose output is missing only when a
    job that needs it runs, so `final` (the report's index, the DAG's target, built from those
    results) goes aside too: the report reruns, and with it every job whose metrics.json it lacks.
    `dry_run`: move nothing, and say what a real run would move and redo. Raises BrokenStore when the
    local store cannot be read, OSError naming a file that cannot move."""
    uri = tracking_uri(configured_uri)
    runs = store_runs(uri)
    store = uri.removeprefix("sqlite:///")
    aside = would_move if dry_run else move_aside
    lines = []
    for name in metrics_files:
        why = problem(Path(name), runs, store)
        if why is not None:
            lines.append(aside(Path(name), why))
    if lines and Path(final).exists():
        lines.append(aside(Path(final), "built from the results above"))
    return lines
