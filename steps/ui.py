"""Serve this lab's MLflow store on localhost: `python -m steps.ui [--port 0]`.

A thin launcher around the real `mlflow server` (same as `mlflow ui --backend-store-uri
sqlite:///results/mlflow.db --host 127.0.0.1`), which also picks a free port when asked and refuses
a missing database instead of silently creating an empty one.

The server runs the lab's MLflow app (`steps/tracking/mlflow_app.py`): MLflow's own, but a browser
with no choice stored opens the UI's model-training pages, where an experiment opens on its runs,
instead of its GenAI pages and an empty traces overview. The address it prints also carries
`?workflowType=machine_learning`, which the UI honours on any server.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sqlite3
import sys
from importlib.metadata import entry_points
from pathlib import Path

from steps import paths
from steps.tracking import store
from steps.tracking.describe import report_url, ui_url
from steps.tracking.mlflow_app import REPORTS_ENV

APP_NAME = "n00bgpt-lab"  # the `mlflow.app` entry point in pyproject.toml: steps/tracking/mlflow_app.py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether another process listens on `port` (the server would fail after the address was printed)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a closed server's TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def follow_moved_store(db: Path) -> None:
    """A results/ folder copied or moved here: point its artifact locations here before serving it
    (steps/tracking/portable.py), or say why not in one line and serve it as it is."""
    uri = f"sqlite:///{db.resolve()}"
    try:
        with store.write_lock(uri):
            store.follow_moved_store(uri)
    except (OSError, sqlite3.Error) as exc:
        print(f"(cannot re-root {db} at its folder: {exc}; its artifacts are read where it was written)", flush=True)


def serve_report(db: Path, base: str | None) -> None:
    """Have the lab's app serve the store's report (`<results>/reports/`) under `base`, and say where."""
    reports = db.resolve().parent / "reports"
    os.environ[REPORTS_ENV] = str(reports)  # read by steps/tracking/mlflow_app.py in the server
    if base and (reports / "index.html").exists():
        print(f"the lab's report on {report_url(base)}", flush=True)


def app_registered() -> bool:
    """Whether the installed package declares the lab's `mlflow.app` entry point (a checkout
    updated without `pip install -e .` again does not)."""
    return any(ep.name == APP_NAME for ep in entry_points(group="mlflow.app"))


def server_command(db: Path, port: int, host: str = "127.0.0.1", app: bool = True) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{db.resolve()}",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
        *(["--app-name", APP_NAME] if app else []),
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m steps.ui", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--db", type=Path, default=paths.MLFLOW_DB, help="the store (default: %(default)s)")
    ap.add_argument("--port", type=int, default=5000, help="0 = any free port (default: %(default)s)")
    args = ap.parse_args(argv)
    if not args.db.exists():
        sys.exit(f"{args.db} does not exist: run `snakemake --cores all` first, or pass --db")
    if args.port and port_taken(args.port):
        sys.exit(
            f"steps.ui: port {args.port} on 127.0.0.1 is in use (another server?): pass --port 0 for any free port"
        )
    port = args.port or free_port()
    follow_moved_store(args.db)
    base = f"http://127.0.0.1:{port}"
    print(f"MLflow UI on {ui_url(base)}  (Ctrl-C to stop)", flush=True)
    app = app_registered()
    if not app:
        print(
            f"(the lab's MLflow app '{APP_NAME}' is not registered: run `pip install -e .` again; serving "
            "MLflow's own app, whose pages a new browser opens in GenAI mode until 'Model training' is clicked)",
            flush=True,
        )
    serve_report(args.db, base if app else None)
    cmd = server_command(args.db, port, app=app)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
