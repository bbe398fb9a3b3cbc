"""MLflow access for every stage: one experiment per stage, SQLite under results/ by default.

SQLite has a single writer, so writes from concurrent jobs are serialised with an advisory file
lock next to the database and retried on "database is locked"; the schema is created once under
the same lock, which removes the migration race between jobs that start together.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from steps import paths

EXPERIMENT_PREFIX = "n00bgpt"

# MLflow's HTTP client (mlflow/environment_variables.py) retries 7 times, backoff factor 2, 120 s
# timeout: about 4 minutes per call to a dead server. The lab's: 2 retries (sleeps 0 and 2 s, plus
# up to 1 s jitter) of a 15 s request: a refused connection fails a call in about 3 s, a server that
# accepts and never answers in about 50 s (steps/tracking/server.py says what to do).
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}


def tracking_uri(configured: str | None = None) -> str:
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{paths.MLFLOW_DB.resolve()}"


def _is_local_sqlite(uri: str) -> bool:
    return uri.startswith("sqlite:///")


def local_db(uri: str) -> Path | None:
    """The database file of a local SQLite store; None for a server or another database."""
    return Path(uri.removeprefix("sqlite:///")) if _is_local_sqlite(uri) else None


@contextlib.contextmanager
def write_lock(uri: str):
    """Hold an exclusive lock for a local SQLite store; no-op for servers and real databases."""
    db = local_db(uri)
    if db is None:
        yield
        return
    lock_path = db.with_suffix(".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def retrying(fn, *args, attempts: int = 8, **kwargs):
    """Call an MLflow write, retrying SQLite lock contention (and the dataset-row race) with backoff.
    Nothing else: a refused or timed-out connection already had MLflow's own HTTP retries
    (HTTP_DEFAULTS), and retrying it again only hides a dead server (steps/tracking/server.py)."""
    delay = 0.2
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # MlflowException wraps sqlalchemy OperationalError
            text = str(exc).lower()
            # two jobs logging the same new dataset at once through a server race on its row
            # (SQLite: "UNIQUE constraint failed: datasets.", PostgreSQL: "duplicate key ... datasets")
            race = "unique constraint failed: datasets." in text or ("duplicate key" in text and "datasets" in text)
            locked = "database is locked" in text or "database table is locked" in text or "database is busy" in text
            if not (locked or race) or i == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def http_defaults() -> None:
    """The lab's short MLflow HTTP retries for this process and its children, unless already set."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def client(uri: str | None = None):
    """An MlflowClient on an initialised store (creates the SQLite schema once, under the lock)."""
    import mlflow  # steps.tracking stays light (every job imports it; mlflow_run's docstring)
    from mlflow.tracking import MlflowClient

    http_defaults()
    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    with write_lock(uri):
        seed_new_store(uri)
        c = MlflowClient(uri)
        retrying(c.search_experiments, max_results=1)  # forces schema creation/migration
        follow_moved_store(uri)
    return c


def empty_store() -> Path | None:
    """An empty store as MLflow makes it (its ~60 schema migrations, 5-10 s of CPU), made once per MLflow
    version in the user's cache folder (~/.cache/n00bgpt, or $XDG_CACHE_HOME): every new results/
    folder starts as a copy of it. None where there is no such folder or it cannot be written (MLflow
    then makes each new store itself, as before)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    try:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "n00bgpt"
        path = cache / f"mlflow-{mlflow.__version__}-empty.db"
        if path.exists():
            return path
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            made = Path(tmp) / "mlflow.db"
            MlflowClient(f"sqlite:///{made}").search_experiments(max_results=1)  # MLflow's own migrations
            os.replace(made, path)  # no transaction is open; whole or absent, also with two jobs at once
    except (OSError, RuntimeError):  # RuntimeError: no home folder to find (Path.home)
        return None
    return path


def seed_new_store(uri: str) -> None:
    """A local SQLite store that does not exist yet (or is an empty file) starts as a copy of
    `empty_store()`, with what MLflow sets at creation set again here: the `Default` experiment's
    artifact location (from this process's folder, as MLflow derives it) and its times.
    tests/test_portable_store.py checks a seeded store against one MLflow makes. Call under the lock."""
    db = local_db(uri)
    if db is None or (db.exists() and db.stat().st_size > 0):
        return
    template = empty_store()
    if template is None:
        return
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.tracking._tracking_service.utils import _SERVER_ARTIFACT_ROOT_ENV_VAR
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    # the Default experiment's location as MLflow's _get_sqlalchemy_store derives it
    root = os.environ.get(_SERVER_ARTIFACT_ROOT_ENV_VAR, DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
    location = append_to_uri_path(resolve_uri_if_local(root), "0")
    now = int(time.time() * 1000)
    new = db.with_name(db.name + ".new")
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, new)
    with contextlib.closing(sqlite3.connect(new)) as con, con:
        con.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
            "WHERE experiment_id = 0",
            (location, now, now),
        )
    os.replace(new, db)


def follow_moved_store(uri: str) -> None:
    """A local store opened from another folder than its last (a copied or moved results/): its
    artifact locations follow it (steps/tracking/portable.py). Call under the store's write lock."""
    db = local_db(uri)
    if db is not None:
        from steps.tracking.portable import reroot

        reroot(db)


def experiment_name(stage: str) -> str:
    return f"{EXPERIMENT_PREFIX}/{stage}"


def experiment_id(c, stage: str, uri: str, description: str = "") -> str:
    """The stage's experiment (created on first use), marked as a model-training experiment and
    described (steps/tracking/describe.py); an existing one gets the current description."""
    from steps.tracking.describe import EXPERIMENT_KIND, KIND, NOTE

    name = experiment_name(stage)
    tags = {KIND: EXPERIMENT_KIND, **({NOTE: description} if description else {})}
    with write_lock(uri):
        exp = retrying(c.get_experiment_by_name, name)
        if exp is not None:
            for key, value in tags.items():
                if exp.tags.get(key) != value:
                    retrying(c.set_experiment_tag, exp.experiment_id, key, value)
            return exp.experiment_id
        location = None
        if _is_local_sqlite(uri):
            location = (paths.ARTIFACTS.resolve() / stage).as_uri()
        try:
            return retrying(
                c.create_experiment,
                name,
                artifact_location=location,
                tags={"stage": stage, "project": "n00bGPT lab", **tags},
            )
        except Exception as exc:  # another job created it since (jobs on a server hold no shared lock)
            if "already exists" not in str(exc).lower():
                raise
            return retrying(c.get_experiment_by_name, name).experiment_id


class StoreNotWritable(SystemExit):
    """A local store this process cannot write. A SystemExit, so `python -m steps.tracking.lab
    start` (the Snakefile's onstart) and a job (steps.core.job) print its one line, no traceback."""


def check_writable(uri: str) -> None:
    """Stop on a local SQLite store that cannot be written (a read-only results/, mlflow.db, lock
    file or file system), naming the path and the fix. Found otherwise deep in a traceback: an
    OSError on the lock file, or SQLite's "attempt to write a readonly database" at the first run.
    SQLite writes its journal beside the database, so the folder must be writable too."""
    db = local_db(uri)
    if db is None:
        return
    folder = next(p for p in (db.parent, *db.parent.parents) if p.exists())  # where mkdir would start
    for path in (folder, db, db.with_suffix(".lock")):
        if path.exists() and not os.access(path, os.W_OK):
            read_only_fs = os.statvfs(path).f_flag & os.ST_RDONLY
            why, fix = (
                ("is on a read-only file system", f"remount {folder} read-write")
                if read_only_fs
                else ("is not writable by this user", f"chmod -R u+w {folder}")
            )
            raise StoreNotWritable(
                f"{path} {why}, so the MLflow store {db} cannot be written; fix: {fix}, "
                'or set tracking.uri to a writable store (e.g. --config \'tracking={"uri": "sqlite:////tmp/mlflow.db"}\')'
            )


def init(uri: str | None = None) -> str:
    """Create the store before jobs fan out (called from the Snakefile's onstart)."""
    uri = tracking_uri(uri)
    check_writable(uri)
    if _is_local_sqlite(uri):
        paths.RESULTS.mkdir(parents=True, exist_ok=True)
    client(uri)
    return uri
