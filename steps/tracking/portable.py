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

What the UI shows besides locations follows too (#49 9): a path under the old folder in a dataset's
source, a run's or experiment's tag (a description), and a logged model's MLmodel file (its
`artifact_path`). Where the store is the lab's `<workdir>/results`, the workdir itself (the lab run's
`workdir` tag and description, the Default experiment's MLflow-made `<workdir>/mlruns/0`) follows to the
new folder's parent. `python -m steps.ui` also hides the Default experiment while it has no run
(`hide_empty_default`): every lab run is in a `n00bgpt/<stage>` experiment, and its tag above is internal.
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


# every text column that may name a path under the store's folder (matched as "<folder>/" anywhere in it)
TEXTS = (
    ("datasets", "dataset_source"),
    ("tags", "value"),
    ("experiment_tags", "value"),
    ("logged_model_tags", "value"),
)
LAB_FOLDER = "results"  # the lab's store is <workdir>/results/mlflow.db (steps/paths.py)


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def rewrite(con: sqlite3.Connection, old: str, new: str) -> int:
    """Every location under `old` (a plain path or a file:// URI) moved under `new`, and every path under
    `old` named in a text (TEXTS); where `old` is a lab's `<workdir>/results`, its workdir too (the
    `workdir` tag, a description's `` `<workdir>` ``, the Default experiment's location); the rows changed."""
    changed = 0
    for table, column in LOCATIONS:
        changed += _move_prefix(con, table, column, old, new)
    for table, column in TEXTS:
        if column not in _columns(con, table):
            continue
        cur = con.execute(
            f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) WHERE instr("{column}", ?) > 0',
            (old + "/", new + "/", old + "/"),
        )
        changed += cur.rowcount
    old_work, new_work = str(Path(old).parent), str(Path(new).parent)
    if Path(old).name == LAB_FOLDER and old_work != "/":
        cur = con.execute("UPDATE tags SET value = ? WHERE key = 'workdir' AND value = ?", (new_work, old_work))
        cur2 = con.execute(
            "UPDATE tags SET value = replace(value, ?, ?) WHERE key = 'mlflow.note.content' AND instr(value, ?) > 0",
            (f"`{old_work}`", f"`{new_work}`", f"`{old_work}`"),
        )
        changed += cur.rowcount + cur2.rowcount
        changed += _move_prefix(con, "experiments", "artifact_location", f"{old_work}/mlruns", f"{new_work}/mlruns")
        for table, column in TEXTS:  # the workdir itself named in a text: a dataset's source `{"uri": "<workdir>"}`
            if column not in _columns(con, table):
                continue
            for a, b in ((f'"{old_work}"', f'"{new_work}"'), (old_work + "/", new_work + "/")):
                cur = con.execute(
                    f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) WHERE instr("{column}", ?) > 0',
                    (a, b, a),
                )
                changed += cur.rowcount
    return changed


def _move_prefix(con: sqlite3.Connection, table: str, column: str, old: str, new: str) -> int:
    """`table.column` values equal to `old` or under it (a plain path or a file:// URI) moved under `new`."""
    if column not in _columns(con, table):
        return 0
    changed = 0
    for a, b in ((f"file://{old}", f"file://{new}"), (old, new)):
        sql = (
            f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) '
            f'WHERE "{column}" = ? OR substr("{column}", 1, ?) = ?'
        )
        changed += con.execute(sql, (b, len(a) + 1, a, len(a) + 1, a + "/")).rowcount
    return changed


def rewrite_model_files(con: sqlite3.Connection, old: str, new: str) -> int:
    """Each logged model's MLmodel file (in the copied artifacts) names its folder as `artifact_path`:
    under `old`, moved under `new`; the files changed (one that cannot be written is left as it is)."""
    changed = 0
    if "logged_models" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}:
        return 0
    for (location,) in con.execute("SELECT artifact_location FROM logged_models"):
        mlmodel = Path(str(location).removeprefix("file://")) / "MLmodel"
        try:
            text = mlmodel.read_text()
            if f"{old}/" in text:
                mlmodel.write_text(text.replace(f"{old}/", f"{new}/"))
                changed += 1
        except OSError:
            continue
    return changed


def hide_empty_default(db: Path) -> bool:
    """The Default experiment (id 0, which MLflow makes in every store and the lab never logs to) marked
    deleted, as MLflow's own delete does, while it holds no run: the UI's list then shows the lab's
    experiments only; a Default a user logged runs to stays. Whether it was hidden now."""
    con = sqlite3.connect(db)
    try:
        with con:
            cur = con.execute(
                "UPDATE experiments SET lifecycle_stage = 'deleted' WHERE experiment_id = 0 AND "
                "lifecycle_stage = 'active' AND NOT EXISTS (SELECT 1 FROM runs WHERE experiment_id = 0)"
            )
        return cur.rowcount > 0
    finally:
        con.close()


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
            changed += rewrite_model_files(con, old, new) if old else 0
            con.execute(
                "INSERT OR REPLACE INTO experiment_tags (key, value, experiment_id) VALUES (?, ?, 0)", (ROOT_TAG, new)
            )
        return old, changed
    finally:
        con.close()
