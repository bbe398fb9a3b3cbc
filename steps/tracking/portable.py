"""A portable store: a `results/` folder copied or moved elsewhere keeps its artifacts, and new runs write
into the copy, never the original.

MLflow records absolute artifact locations (`file:///.../results/mlartifacts/<stage>` per experiment,
`.../<run>/artifacts` per run), so a copied store would read and write the original's files. MLflow's
other answer, a server with `--serve-artifacts` handing out `mlflow-artifacts:/` locations, needs
every job to log through that server; the lab's jobs write to the SQLite file directly. So the store
is re-rooted instead: it records the folder it was last opened in (the tag ROOT_TAG on the `Default`
experiment, id 0, which MLflow creates in every store), and when it is opened from another folder
(`store.client`, `python -m steps.ui`) every location under the old folder is rewritten to the same
path under the new one, in one transaction under the store's write lock. Locations outside the old
folder (artifacts that were never in it) are left alone. docs/tracking.md says the same for users.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

ROOT_TAG = "n00bgpt.store_root"
# every column of MLflow's schema that holds an artifact location (those a table lacks are skipped)
LOCATIONS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def recorded_root(con: sqlite3.Connection) -> str | None:
    """The folder the store was last opened in, if it says."""
    row = con.execute("SELECT value FROM experiment_tags WHERE experiment_id = 0 AND key = ?", (ROOT_TAG,)).fetchone()
    return row[0] if row else None


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def rewrite(con: sqlite3.Connection, old: str, new: str) -> int:
    """Every location under `old` (a plain path or a file:// URI) moved under `new`; the rows changed."""
    changed = 0
    for table, column in LOCATIONS:
        if column not in _columns(con, table):
            continue
        for a, b in ((f"file://{old}", f"file://{new}"), (old, new)):
            sql = (
                f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) '
                f'WHERE "{column}" = ? OR substr("{column}", 1, ?) = ?'
            )
            cur = con.execute(sql, (b, len(a) + 1, a, len(a) + 1, a + "/"))
            changed += cur.rowcount
    return changed


def reroot(db: Path) -> tuple[str | None, int]:
    """Re-root the SQLite store `db` at its folder (call under the store's write lock): (the folder
    it was rooted in before, or None when it was already here; the locations rewritten). A store that
    records no root (new, or written before this) records its folder and changes nothing."""
    new = str(db.resolve().parent)
    con = sqlite3.connect(db)
    try:
        if "experiment_tags" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}:
            return None, 0  # no schema yet: store.client creates it first
        if not con.execute("SELECT 1 FROM experiments WHERE experiment_id = 0").fetchone():
            return None, 0  # no Default experiment to hold the tag: nothing recorded, nothing moved
        old = recorded_root(con)
        if old == new:
            return None, 0
        with con:  # one transaction: every location or none
            changed = rewrite(con, old, new) if old else 0
            con.execute(
                "INSERT OR REPLACE INTO experiment_tags (key, value, experiment_id) VALUES (?, ?, 0)", (ROOT_TAG, new)
            )
        return old, changed
    finally:
        con.close()
