"""Serve this lab's MLflow store on localhost: `python -m steps.ui [--port 0]`.

A thin launcher around the real `mlflow server` (same as `mlflow ui --backend-store-uri
sqlite:///results/mlflow.db --host 127.0.0.1`), which also picks a free port when asked and refuses
a missing database instead of silently creating an empty one.

The server runs the lab's MLflow app (`steps/ui_app.py`): MLflow's own, but a browser
with no choice stored opens the UI's model-training pages, where an experiment opens on its runs,
instead of its GenAI pages and an empty traces overview. The address it prints also carries
`?workflowType=machine_learning`, which the UI honours on any server.

The address is printed once the server answers (MLflow's server takes ~20 s to start on 2 cores), and
the server's access log (a line per request, a thousand in one browse) and INFO chatter stay out of the
terminal unless `--verbose`: its warnings, errors and tracebacks are shown as they come.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

from steps import paths
from steps.tracking import store
from steps.tracking.describe import COMPARE_PATH, UI_PORT, report_url, ui_url
from steps.tracking.portable import hide_empty_default
from steps.ui_app import REPORTS_ENV, STORE_ENV

APP_NAME = "n00bgpt-lab"  # the `mlflow.app` entry point in pyproject.toml: steps/ui_app.py
# the server's lines left out unless --verbose: its log records at INFO (uvicorn's "INFO:     ..." too),
# its notes on defaults the lab chose, and deprecation warnings (a library's, nothing a user can act on)
CHATTER = re.compile(
    r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d INFO\b|^Registry store URI not provided|^\[MLflow\] Security middleware "
    r"enabled with default settings"
)
DEPRECATION = re.compile(r"^\S.*:\d+: \w*DeprecationWarning: ")  # its next line, indented, is the source line


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
    """A results/ folder copied or moved here: point its artifact locations (and the paths its tags,
    datasets and models name) here before serving it, and hide its Default experiment while it is empty
    (steps/tracking/portable.py), or say why not in one line and serve it as it is."""
    uri = f"sqlite:///{db.resolve()}"
    try:
        with store.write_lock(uri):
            store.follow_moved_store(uri)
            hide_empty_default(db)
    except (OSError, sqlite3.Error) as exc:
        print(f"(cannot re-root {db} at its folder: {exc}; its artifacts are read where it was written)", flush=True)


def serve_report(db: Path) -> Path:
    """Have the lab's app serve the store's report (`<results>/reports/`); the folder."""
    reports = db.resolve().parent / "reports"
    os.environ[REPORTS_ENV] = str(reports)  # read by steps/ui_app.py in the server
    os.environ[STORE_ENV] = f"sqlite:///{db.resolve()}"  # its compare page
    return reports


def app_registered() -> bool:
    """Whether the installed package declares the lab's `mlflow.app` entry point (a checkout
    updated without `pip install -e .` again does not)."""
    return any(ep.name == APP_NAME for ep in entry_points(group="mlflow.app"))


def server_command(db: Path, port: int, host: str = "127.0.0.1", app: bool = True, verbose: bool = False) -> list[str]:
    """`mlflow server` on `db`; without `verbose`, uvicorn (MLflow's default server) logs no request."""
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
        *([] if verbose else ["--uvicorn-opts", "--no-access-log"]),
    ]


def answers(base: str) -> bool:
    """Whether the server at `base` answers its health check (asked directly: an http_proxy set for the
    outside world would never reach this machine's 127.0.0.1)."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(f"{base}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def relay(lines, out=None) -> None:
    """The server's output less its chatter (CHATTER, DEPRECATION), as it comes (to stderr)."""
    source_line = False
    for line in lines:
        skip = CHATTER.match(line) or DEPRECATION.match(line) or (source_line and line.startswith("  "))
        source_line = bool(DEPRECATION.match(line))
        if not skip:
            (out or sys.stderr).write(line)
            (out or sys.stderr).flush()


def serve(cmd: list[str], base: str, ready: list[str], verbose: bool = False) -> int:
    """Run the server `cmd` until it ends, printing `ready` (the addresses) once it answers at `base`;
    its exit code. Ctrl-C reaches the server from the terminal; SIGTERM here is passed on to it."""
    pipe = None if verbose else subprocess.PIPE
    proc = subprocess.Popen(cmd, stdout=pipe, stderr=subprocess.STDOUT if pipe else None, text=True)
    relaying = threading.Thread(target=relay, args=(proc.stdout,), daemon=True)
    if pipe:
        relaying.start()
    signal.signal(signal.SIGTERM, lambda *_: proc.poll() is None and proc.terminate())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server has it too, and shuts down
    while proc.poll() is None and not answers(base):
        time.sleep(0.25)
    answered = proc.poll() is None
    if answered:
        print("\n".join(ready), flush=True)
    code = proc.wait()
    if pipe:
        relaying.join(timeout=5)  # its last words (an error) before ours
    if code or not answered:
        when = "" if answered else " before it answered (--verbose shows all it said)"
        print(f"steps.ui: the MLflow server ended with exit code {code}{when}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m steps.ui", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--db", type=Path, default=paths.MLFLOW_DB, help="the store (default: %(default)s)")
    ap.add_argument("--port", type=int, default=UI_PORT, help="0 = any free port (default: %(default)s)")
    ap.add_argument("--verbose", action="store_true", help="the server's access log and INFO lines too")
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
    print(f"steps.ui: starting MLflow's server on {args.db} (its address follows once it answers) ...", file=sys.stderr)
    app = app_registered()
    if not app:
        print(
            f"(the lab's MLflow app '{APP_NAME}' is not registered: run `pip install -e .` again; serving "
            "MLflow's own app, whose pages a new browser opens in GenAI mode until 'Model training' is clicked)",
            flush=True,
        )
    reports = serve_report(args.db)
    ready = [f"MLflow UI on {ui_url(base)}  (Ctrl-C to stop)"]
    if app and (reports / "index.html").exists():
        ready.append(f"the lab's report on {report_url(base)}")
    if app:
        ready.append(f"two lab runs side by side on {base}/{COMPARE_PATH}")
    sys.exit(serve(server_command(args.db, port, app=app, verbose=args.verbose), base, ready, args.verbose))


if __name__ == "__main__":
    main()
