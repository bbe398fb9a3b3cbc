"""Read the lab's runs from its store, fast: a local SQLite store with four SQL queries on a read-only
connection (importing MLflow alone takes seconds, and one search per experiment more), any other
store (an `http://` server, a real database) with MLflow's client, one search per experiment. Both give
the same records: {run_id, experiment_id, start, end, status, tags, params, metrics}.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from steps.tracking import store

# the run tags compare reads (the SQL reader fetches only these: a run has dozens of version.* tags)
TAGS = ("cell", "stage", "status", "mlflow.parentRunId", "mlflow.runName", "reason", "error")
TAGS += ("sweep", "sweep_value", "sweep_order")  # a sweep's cells (steps/config/sweep.py, compare --sweep)


class CompareError(Exception):
    """Bad input: no store, unknown stage, unknown metric. The message says how to fix it."""


@dataclass
class Store:
    """The lab's experiments in one store: {name without the `n00bgpt/` prefix: experiment id} and
    every active run of them (a list of records, oldest first)."""

    uri: str
    experiments: dict[str, str]
    runs: list[dict] = field(default_factory=list)

    def of(self, name: str) -> list[dict]:
        """The runs of experiment `name` (a stage, or `lab`)."""
        eid = self.experiments.get(name)
        return [r for r in self.runs if r["experiment_id"] == eid]


def sqlite_path(uri: str) -> Path | None:
    """The database file of a local SQLite URI (sqlite:///relative or sqlite:////absolute), else None."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def read(uri: str | None = None) -> Store:
    """Every lab experiment and run of the store at `uri` (default: the jobs' own, steps/tracking/store.py);
    never creates an empty database."""
    uri = store.tracking_uri(uri)
    db = sqlite_path(uri)
    if db is None:
        return read_with_client(uri)
    if not db.exists():
        raise CompareError(
            f"no MLflow store at {db.resolve()}: run the DAG first (`snakemake --cores 2`, or "
            "`snakemake --cores 2 --configfile configs/smoke.yaml` for the tiny one), or pass --tracking-uri"
        )
    try:
        return read_sqlite(uri, db)
    except sqlite3.Error as exc:
        raise CompareError(f"cannot read the MLflow store {db}: {exc} (is it an MLflow database?)") from None


def _rows(con: sqlite3.Connection, sql: str, args: tuple = ()) -> list[tuple]:
    return con.execute(sql, args).fetchall()


def read_sqlite(uri: str, db: Path) -> Store:
    """The SQL behind MLflow's search_runs, for the lab's experiments only: active runs, their latest
    metric values (NaN kept as NaN), their params and the tags in TAGS."""
    con = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True)
    try:
        prefix = f"{store.EXPERIMENT_PREFIX}/"
        exps = {
            name.removeprefix(prefix): str(eid)
            for eid, name in _rows(
                con,
                "SELECT experiment_id, name FROM experiments WHERE lifecycle_stage = 'active' AND name LIKE ? "
                "ORDER BY experiment_id",
                (prefix + "%",),
            )
        }
        runs: dict[str, dict] = {}
        where = "r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active' AND e.name LIKE ?"
        join = "FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id"
        for rid, eid, start, end, status in _rows(
            con,
            f"SELECT r.run_uuid, r.experiment_id, r.start_time, r.end_time, r.status {join} WHERE {where} "
            "ORDER BY r.start_time, r.run_uuid",
            (prefix + "%",),
        ):
            runs[rid] = record(rid, str(eid), start, end, status)
        marks = ",".join("?" * len(TAGS))
        for rid, key, value in _rows(
            con, f"SELECT t.run_uuid, t.key, t.value FROM tags t WHERE t.key IN ({marks})", TAGS
        ):
            if rid in runs:
                runs[rid]["tags"][key] = value
        for rid, key, value in _rows(con, "SELECT run_uuid, key, value FROM params"):
            if rid in runs:
                runs[rid]["params"][key] = value
        for rid, key, value, is_nan in _rows(con, "SELECT run_uuid, key, value, is_nan FROM latest_metrics"):
            if rid in runs:
                runs[rid]["metrics"][key] = math.nan if is_nan else value
    finally:
        con.close()
    return Store(uri, exps, list(runs.values()))


def record(run_id: str, experiment_id: str, start, end, status: str) -> dict:
    return {
        "run_id": run_id,
        "experiment_id": experiment_id,
        "start": start or 0,
        "end": end,
        "status": status,
        "tags": {},
        "params": {},
        "metrics": {},
    }


def read_with_client(uri: str) -> Store:
    """The same records through MLflow's client: one paged search per lab experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    prefix = f"{store.EXPERIMENT_PREFIX}/"
    try:
        found = [e for e in client.search_experiments(max_results=1000) if e.name.startswith(prefix)]
    except Exception as exc:  # noqa: BLE001 - MlflowException, connection errors: say which store
        raise CompareError(f"cannot read the MLflow store {uri}: {exc}") from None
    exps = {e.name.removeprefix(prefix): e.experiment_id for e in sorted(found, key=lambda e: int(e.experiment_id))}
    runs = []
    for eid in exps.values():
        token = None
        while True:
            page = client.search_runs([eid], max_results=1000, page_token=token)
            for r in page:
                rec = record(r.info.run_id, eid, r.info.start_time, r.info.end_time, r.info.status)
                rec["tags"] = {k: v for k, v in r.data.tags.items() if k in TAGS}
                rec["params"], rec["metrics"] = dict(r.data.params), dict(r.data.metrics)
                runs.append(rec)
            token = page.token
            if not token:
                break
    return Store(uri, exps, sorted(runs, key=lambda r: (r["start"], r["run_id"])))


def open_store(uri: str | None):
    """(a read-only MlflowClient on the lab's store, its URI); never creates an empty database
    (steps.record reads a finished run's artifacts with it)."""
    from mlflow.tracking import MlflowClient

    uri = store.tracking_uri(uri)
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        read(uri)  # raises the error that says how to make one
    if db is not None:
        with store.write_lock(uri):  # a moved results/ folder: its artifacts are read where they are now
            store.follow_moved_store(uri)
    client = MlflowClient(uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - MlflowException, connection errors: say which store
        raise CompareError(f"cannot read the MLflow store {uri}: {exc}") from None
    return client, uri
