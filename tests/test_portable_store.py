"""A `results/` folder copied or moved elsewhere keeps its artifacts and writes into the copy, never the
original (steps/tracking/portable.py); `python -m steps.ui` serves such a copy, its report under the
UI's base (run links relative to it) and refuses a busy port. Real stores: copies of the smoke DAG's."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

import pytest

from steps.tracking import store
from steps.tracking.describe import report_run_link, report_url
from steps.tracking.mlflow_run import MlflowRun
from steps.tracking.portable import ROOT_TAG
from tests.conftest import clean_env


def files(folder: Path) -> dict[str, tuple[float, int]]:
    """Every file under `folder` with its modification time and size (what a write would change)."""
    return {str(p): (p.stat().st_mtime, p.stat().st_size) for p in folder.rglob("*") if p.is_file()}


def lab_run_id(results: Path) -> str:
    """The smoke DAG's lab run (it logged config.json as an artifact, steps/tracking/lab.py)."""
    con = sqlite3.connect(results / "mlflow.db")
    try:
        return con.execute(
            "SELECT r.run_uuid FROM runs r JOIN experiments e USING (experiment_id) WHERE e.name = 'n00bgpt/lab'"
        ).fetchone()[0]
    finally:
        con.close()


def locations(results: Path) -> list[str]:
    con = sqlite3.connect(results / "mlflow.db")
    try:
        rows = con.execute("SELECT artifact_location FROM experiments UNION ALL SELECT artifact_uri FROM runs")
        return [r[0] for r in rows]
    finally:
        con.close()


@pytest.fixture
def original(smoke_dag, tmp_path) -> Path:
    """A copy of the smoke DAG's results/ opened where it lies (so rooted there), as a user's own."""
    results = tmp_path / "original" / "results"
    shutil.copytree(smoke_dag / "results", results)
    store.client(f"sqlite:///{results / 'mlflow.db'}")
    assert all(str(smoke_dag) not in loc for loc in locations(results) if "mlartifacts" in loc)
    return results


def chmod_tree(folder: Path, writable: bool) -> None:
    for p in [folder, *folder.rglob("*")]:
        mode = p.stat().st_mode
        p.chmod(mode | 0o200 if writable else mode & ~0o222)


def test_a_copied_store_reads_its_artifacts_and_writes_into_the_copy(original, tmp_path, monkeypatch):
    copy = tmp_path / "copy" / "results"
    shutil.copytree(original, copy)
    before = files(original)
    chmod_tree(original, writable=False)  # any write into the original now fails loudly
    try:
        monkeypatch.chdir(copy.parent)  # where a job runs: its new experiments' artifacts go to ./results
        uri = f"sqlite:///{copy / 'mlflow.db'}"
        client = store.client(uri)
        assert all(str(original) not in loc for loc in locations(copy))
        lab = lab_run_id(copy)
        got = Path(client.download_artifacts(lab, "config.json", str(tmp_path)))
        assert json.loads(got.read_text()) == json.loads(
            (original / "mlartifacts" / "lab" / lab / "artifacts" / "config.json").read_text()
        )
        run = MlflowRun(uri, "perf", "after_copy", "hash", 0)
        run.start({"x": 1}, {"seed": 0})
        note = tmp_path / "note.txt"
        note.write_text("written after the copy")
        run.log_artifact(note)
        run.end("ok")
        written = copy / "mlartifacts" / "perf" / run.run_id / "artifacts" / "note.txt"
        assert written.read_text() == "written after the copy"
        assert client.get_run(run.run_id).info.artifact_uri == written.parent.as_uri()
        assert files(original) == before  # nothing written under the original
        assert not list(original.rglob(run.run_id))
    finally:
        chmod_tree(original, writable=True)


def test_a_moved_store_follows_its_folder(original, tmp_path):
    moved = tmp_path / "moved" / "results"
    moved.parent.mkdir()
    shutil.move(original, moved)
    client = store.client(f"sqlite:///{moved / 'mlflow.db'}")
    lab = lab_run_id(moved)
    assert client.get_run(lab).info.artifact_uri.startswith((moved / "mlartifacts").as_uri())
    assert "config.json" in [a.path for a in client.list_artifacts(lab)]
    con = sqlite3.connect(moved / "mlflow.db")
    tag = con.execute("SELECT value FROM experiment_tags WHERE key = ? AND experiment_id = 0", (ROOT_TAG,)).fetchone()
    con.close()
    assert tag == (str(moved),) and not original.exists()  # nothing recreated where it was


def start_ui(db: Path, port: int = 0) -> tuple[subprocess.Popen, str]:
    """`python -m steps.ui --db DB --port N`; (the server, its base address) once it answers."""
    cmd = [sys.executable, "-m", "steps.ui", "--db", str(db), "--port", str(port)]
    proc = subprocess.Popen(
        cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    line = proc.stdout.readline()
    base = re.match(r"MLflow UI on (http://127\.0\.0\.1:\d+)/", line)
    assert base, line
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{base.group(1)}/health", timeout=2)
            return proc, base.group(1)
        except OSError:
            assert proc.poll() is None, "steps.ui exited"
            time.sleep(0.5)
    raise AssertionError("steps.ui did not answer in 180 s")


def stop(proc: subprocess.Popen) -> None:
    """The server and the workers it started (its own process group), however slow their shutdown."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def test_ui_serves_a_moved_store_its_report_and_refuses_a_busy_port(original, tmp_path):
    moved = tmp_path / "elsewhere" / "results"
    moved.parent.mkdir()
    shutil.move(original, moved)
    proc, base = start_ui(moved / "mlflow.db")
    try:
        lab = lab_run_id(moved)
        art = fetch(f"{base}/get-artifact?path=config.json&run_uuid={lab}")
        assert json.loads(art) == json.loads((moved / "mlartifacts/lab" / lab / "artifacts/config.json").read_text())
        page = report_url(base)
        assert b"<html" in fetch(page).lower()
        rec = json.loads((moved / "reports" / "metrics.json").read_text())  # the report job's own run
        link = urljoin(page, report_run_link(rec["experiment_id"], rec["run_id"]))
        assert link.startswith(f"{base}/#/experiments/{rec['experiment_id']}/runs/{rec['run_id']}")
        api = json.loads(fetch(f"{base}/ajax-api/2.0/mlflow/runs/get?run_id={rec['run_id']}"))
        assert api["run"]["info"]["experiment_id"] == rec["experiment_id"]
        port = base.rsplit(":", 1)[1]
        busy = subprocess.run(
            [sys.executable, "-m", "steps.ui", "--db", str(moved / "mlflow.db"), "--port", port],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=120,
        )
        assert busy.returncode != 0 and busy.stdout == ""
        assert busy.stderr.strip().count("\n") == 0 and "--port 0" in busy.stderr and port in busy.stderr
    finally:
        stop(proc)
    assert not original.exists() and os.path.isdir(moved)


def store_contents(db: Path) -> tuple[list, dict]:
    """(schema, every table's rows) of an SQLite store, the creation times of experiment 0 left out
    and the lab's own root tag (portable.py) dropped. A statement's lines are compared as a set: MLflow's
    own migrations write a table's CHECK constraints in an order that changes from run to run (two
    stores MLflow makes differ in it)."""

    def lines(sql: str | None) -> list[str]:
        return sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())

    with sqlite3.connect(db) as con:
        found = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        schema = sorted(((t, n, tbl, lines(sql)) for t, n, tbl, sql in found), key=str)
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = {t: sorted(con.execute(f'SELECT * FROM "{t}"').fetchall(), key=str) for t in tables}
        cols = [r[1] for r in con.execute('PRAGMA table_info("experiments")')]
    times = [cols.index("creation_time"), cols.index("last_update_time")]
    rows["experiments"] = [tuple(v for i, v in enumerate(r) if i not in times) for r in rows["experiments"]]
    rows["experiment_tags"] = [r for r in rows["experiment_tags"] if ROOT_TAG not in r]
    return schema, rows


def test_a_new_store_is_the_store_mlflow_makes(tmp_path, monkeypatch):
    """A new store starts as a copy of MLflow's own empty store, made once per MLflow version in the
    cache folder (its migrations cost 5-10 s a store): the same schema, migration head and rows as
    the store MLflow makes in the same folder, the Default experiment's artifact location included."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    made, seeded, again = tmp_path / "made.db", tmp_path / "results" / "mlflow.db", tmp_path / "again" / "mlflow.db"
    MlflowClient(f"sqlite:///{made}").search_experiments(max_results=1)
    store.client(f"sqlite:///{seeded}")
    [template] = (tmp_path / "cache" / "n00bgpt").glob("mlflow-*-empty.db")
    made_schema, made_rows = store_contents(made)
    assert made_rows["alembic_version"] and made_rows["experiments"]
    assert store_contents(seeded) == (made_schema, made_rows)
    mtime = template.stat().st_mtime_ns
    store.client(f"sqlite:///{again}")  # the next new store: a copy of the same template, not made again
    assert template.stat().st_mtime_ns == mtime and store_contents(again) == (made_schema, made_rows)


def test_without_a_cache_folder_mlflow_makes_the_store(tmp_path, monkeypatch):
    """No cache folder to keep the empty store in (here a file stands where it would go): MLflow makes
    the new store itself, with the same contents."""
    (tmp_path / "cache").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert store.empty_store() is None
    store.client(f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    schema, rows = store_contents(tmp_path / "results" / "mlflow.db")
    assert schema and rows["alembic_version"] and [r[1] for r in rows["experiments"]] == ["Default"]


def texts_naming(db: Path, folder: Path) -> list[str]:
    """Every text in the store that names `folder` (table.column[key]), but the command line the user typed
    (its tag, and quoted first in the lab run's description: `snakemake --directory ...` in `<workdir>`)."""
    con = sqlite3.connect(db)
    try:
        found = []
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
            for col in cols:
                key = "key" if "key" in cols and col != "key" else "NULL"
                rows = con.execute(
                    f'SELECT {key}, "{col}" FROM "{table}" WHERE instr(CAST("{col}" AS TEXT), ?) > 0', (f"{folder}",)
                ).fetchall()
                typed = {
                    "command": "",
                    "mlflow.note.content": "`",
                }  # what the user typed: the text, or its `first span`
                for k, v in rows:
                    v = str(v)
                    if k in typed and typed[k]:
                        v = v.split("`", 2)[2] if v.startswith("`") else v
                    if k != "command" and str(folder) in v:
                        found.append(f"{table}.{col}[{k}]: {v[:120]}")
        return found
    finally:
        con.close()


def test_a_copied_store_names_no_original_path(smoke_dag, original, tmp_path):
    """#49 9: the copy (`original`, the smoke DAG's results/ copied and opened elsewhere) names its old
    folder nowhere the UI shows: dataset sources, the lab run's description and workdir tag, the Default
    experiment's location, a logged model's MLmodel; the lab run's workdir is the copy's."""
    assert texts_naming(original / "mlflow.db", smoke_dag) == []
    models = [m for m in original.rglob("MLmodel")]
    assert models and not [m for m in models if str(smoke_dag) in m.read_text()]
    con = sqlite3.connect(original / "mlflow.db")
    workdir = con.execute("SELECT value FROM tags WHERE key = 'workdir'").fetchone()
    sources = [r[0] for r in con.execute("SELECT dataset_source FROM datasets")]
    con.close()
    assert workdir == (str(original.parent),)
    assert sources and all(json.loads(s)["uri"].startswith(f"{original}/") for s in sources)
    assert all(Path(json.loads(s)["uri"]).exists() for s in sources)  # the copied inputs


def test_ui_hides_the_empty_default_experiment(tmp_path):
    """#49 8: the Default experiment MLflow makes (never logged to by the lab, holding the store's
    root tag) is hidden while empty; one a user logged a run to stays."""
    from mlflow.tracking import MlflowClient

    from steps.tracking.portable import hide_empty_default

    db = tmp_path / "results" / "mlflow.db"
    client = store.client(f"sqlite:///{db}")
    store.experiment_id(client, "perf", f"sqlite:///{db}")
    assert hide_empty_default(db)
    assert [e.name for e in MlflowClient(f"sqlite:///{db}").search_experiments()] == ["n00bgpt/perf"]
    other = tmp_path / "other" / "mlflow.db"
    c = store.client(f"sqlite:///{other}")
    c.create_run("0")
    assert not hide_empty_default(other) and "Default" in [e.name for e in c.search_experiments()]
