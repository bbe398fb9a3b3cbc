"""Scale-out tracking: a real PostgreSQL + `mlflow server`, a real stage job logging over HTTP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from steps.ui import free_port
from tests.conftest import clean_env, run_stage, stage_params

PG_BIN = Path("/usr/lib/postgresql/15/bin")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (PG_BIN / "initdb").exists() or shutil.which("runuser") is None,
        reason="PostgreSQL server binaries not installed",
    ),
]


def _wait(check, what: str, timeout: float = 90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _ok(cmd) -> bool:
    return subprocess.run(cmd, capture_output=True).returncode == 0


def _up(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


@pytest.fixture()
def postgres():
    data = Path(tempfile.mkdtemp(prefix="lab-pg-"))
    shutil.chown(data, "postgres")
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run(
        [*as_pg, PG_BIN / "initdb", "-D", data / "db", "-A", "trust", "-U", "lab"], check=True, capture_output=True
    )
    port = free_port()
    server = subprocess.Popen(
        [*as_pg, PG_BIN / "postgres", "-D", data / "db", "-p", str(port), "-h", "127.0.0.1", "-k", data],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    psql = ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "lab", "-d", "postgres"]
    try:
        _wait(lambda: _ok([*psql, "-c", "select 1"]), "postgres")
        subprocess.run([*psql, "-c", "create database mlflow"], check=True, capture_output=True)
        yield f"postgresql://lab@127.0.0.1:{port}/mlflow"
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


def test_stage_logs_to_mlflow_server_backed_by_postgres(postgres, tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            postgres,
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _up(f"{uri}/health"), "mlflow server", timeout=120)
        params = stage_params(
            "prepare_corpus",
            source="builtin:shakespeare",
            unit="scene",
            val_fraction=0.2,
            max_documents=10,
            min_chars=1,
        )
        run_stage(tmp_path, "prepare_corpus", params, common={"tracking": {"uri": uri}})
        rec = json.loads((tmp_path / "results/prepare_corpus/main/metrics.json").read_text())
        assert rec["tracking_uri"] == uri and not (tmp_path / "results/mlflow.db").exists()
        with urllib.request.urlopen(f"{uri}/api/2.0/mlflow/runs/get?run_id={rec['run_id']}") as r:
            run = json.loads(r.read())["run"]
        assert run["info"]["status"] == "FINISHED"
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        assert tags["rule"] == "prepare_corpus" and tags["config_hash"] == rec["config_hash"]
        metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
        assert metrics["train_documents"] == rec["metrics"]["train_documents"] == 8
    finally:
        server.terminate()
        server.wait(timeout=30)
