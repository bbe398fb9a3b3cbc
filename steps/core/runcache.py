"""The run cache: every finished job kept outside the workdir, keyed by what decides its result, and
restored instead of recomputed when the same job comes again (docs/pipeline.md, "Run cache").

    python -m steps.core.runcache <stage> [--input NAME=PATH ...] --output NAME=PATH ... --cfg JSON

is the first half of every stage rule's shell line (workflow/rules/common.smk, STAGE_SHELL): it
restores the job from its entry and exits 0, or exits 1 (no entry, the cache off, an entry that fails
its checksums) and the line goes on to `python -m steps.<stage>`, whose job saves the entry when it
ends ok or skipped (steps/core/job.py). It imports neither torch nor MLflow where the job's run is in
the local store: a restored job costs a Python start, a few hashes and an untar.

The key: sha256 over the stage, the job's resolved config (`--cfg`: params + common, less the
tracking store, which says where the run is logged, not what it is), the source hash of the code it
runs (steps/core/sources.py: what the rule's `code` param records), each `--input`'s content (a
file's bytes; a folder's sorted relative paths and bytes) and its `--output` paths. The knobs
(`cache`, `cache_dir`) are in no job's config (steps/config: RUN_CACHE_KEYS): the Snakefile hands
the resolved folder, or "off", to its jobs in the environment (ENV).

An entry, `<cache folder>/<stage>/<key>/`: files.tar (the job's folder, `folder/...`, and each
declared output outside it, `outputs/<name>/...`), record.json (its metrics.json), run.json (its
MLflow run: tags, params, every metric's history, nested runs), artifacts.tar (the run's artifacts),
and manifest.json (the sha256 and size of each), written last: the entry is built in a temporary
folder beside it and renamed into place, so a partial entry is never seen. An entry that fails a
check is never restored: one line says so, the job is recomputed and its entry written again.

A restored job's metrics.json names the run that computed it where that run is in this job's store
(a rerun in the same results/: its report rows link that run, and the report itself restores); else
a new run in this store, nested under the current lab run, with the original's params, tags, metric
histories, nested runs and artifacts, tagged `restored_from` (the original run id) and
`restored_from_cache` (the entry). Either way the lab run's job table lists the job as restored.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import sys
import tarfile
import tempfile
import time
from pathlib import Path

# The run cache's folder the Snakefile hands its jobs (resolved from `cache`, `cache_dir`), or "off";
# set beforehand, the folder (or "off") that a config naming no `cache_dir` uses.
ENV = "N00BGPT_RUN_CACHE"
OFF = "off"
VERSION = 1
PIECES = ("files.tar", "record.json", "run.json", "artifacts.tar")
# = steps.tracking.mlflow_run.LAB_RUN_ENV (this DAG's lab run), written again: importing that module
# loads steps.core.stage and with it numpy, which the restore path does without
LAB_RUN_ENV = "N00BGPT_LAB_RUN"
CHUNK = 1 << 20
SNAKEMAKE_STAMP = ".snakemake_timestamp"  # Snakemake's, in each directory() output once its job ends


# ---- where ------------------------------------------------------------------------------------
def default_folder(environ=os.environ) -> str:
    """`$XDG_CACHE_HOME/n00bgpt/runs`, else `~/.cache/n00bgpt/runs` (beside the lab's other cache,
    the empty MLflow store of steps/tracking/store.py)."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or Path.home(), ".cache")
    return str(Path(base) / "n00bgpt" / "runs")


def location(config: dict, environ=os.environ) -> str:
    """The folder jobs of this config cache into, absolute, or "off": `cache: false` -> off; else the
    config's `cache_dir`; else the environment's ENV (a folder, or "off"); else default_folder."""
    if not config.get("cache", True):
        return OFF
    chosen = config.get("cache_dir") or environ.get(ENV) or default_folder(environ)
    if chosen.strip().lower() in (OFF, "false", "0", "none", ""):
        return OFF
    return str(Path(chosen).expanduser().absolute())


def folder(environ=os.environ) -> Path | None:
    """The run cache's folder of this job (ENV), or None: off, or a job the Snakefile did not start."""
    value = environ.get(ENV, "").strip()
    return None if value.lower() in ("", OFF) else Path(value)


# ---- the key ----------------------------------------------------------------------------------
def _sha256_file(path: Path, h=None):
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h


def digest(path: str | Path) -> str:
    """A file's or a folder's content as sha256: a folder's sorted relative paths with each file's
    bytes (mtimes and owners left out: a restored folder digests like the one it was saved from)."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_file():
        h.update(b"file\0")
        return _sha256_file(path, h).hexdigest()
    if not path.is_dir():
        return "missing"
    h.update(b"folder\0")
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(set(files) - {SNAKEMAKE_STAMP}):
            f = Path(root) / name
            rel = f.relative_to(path).as_posix()
            h.update(f"{rel}\0".encode())
            if f.is_file():
                h.update(_sha256_file(f).digest())
    return h.hexdigest()


def job_cfg(cfg: dict) -> dict:
    """The job's config as the key sees it: less the tracking store and the cache's own knobs."""
    common = {k: v for k, v in (cfg.get("common") or {}).items() if k not in ("tracking", "cache", "cache_dir")}
    return {**cfg, "common": common}


def key_of(module: str, cfg: dict, inputs: dict, outputs: dict) -> tuple[str, dict]:
    """(key, its parts) of the job that runs `module` on `cfg` with these named inputs and outputs."""
    from steps.core.sources import source_hash

    canonical = json.dumps(job_cfg(cfg), sort_keys=True, default=str)
    parts = {
        "version": VERSION,
        "module": module,
        "code": source_hash(module),
        "cfg": hashlib.sha256(canonical.encode()).hexdigest(),
        "inputs": {name: digest(p) for name, p in sorted(inputs.items())},
        "outputs": dict(sorted(outputs.items())),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(), parts


def machine_kind() -> str:
    """What a skip depends on (a CUDA cell on a CPU, N GPUs needed): CPU model and flags, GPU count.
    A skipped job's entry is restored only on a machine of its kind; results of a run are not."""
    from steps.tracking.provenance import cpu_flags, cpu_model

    gpus = Path("/proc/driver/nvidia/gpus")
    count = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return f"{cpu_model()}; {cpu_flags()}; {count} NVIDIA GPU(s); CUDA_VISIBLE_DEVICES={visible}"


# ---- an entry ---------------------------------------------------------------------------------
def entry_path(cache: Path, stage: str, key: str) -> Path:
    return cache / stage / key


def check(entry: Path, key: str) -> tuple[dict | None, str | None]:
    """(the entry's manifest, None) when every piece is there with its size and sha256; (None, what is
    wrong) otherwise; (None, None) when there is no entry."""
    if not entry.exists():
        return None, None
    try:
        manifest = json.loads((entry / "manifest.json").read_text())
    except FileNotFoundError:
        return None, "no manifest.json: a partial entry"
    except (OSError, ValueError) as exc:
        return None, f"manifest.json unreadable: {exc}"
    if not isinstance(manifest, dict) or manifest.get("version") != VERSION or manifest.get("key") != key:
        return None, "manifest.json names another key or version"
    for name in PIECES:
        want = (manifest.get("pieces") or {}).get(name)
        path = entry / name
        if not want:
            return None, f"manifest.json lists no {name}"
        if not path.is_file():
            return None, f"{name} missing"
        if path.stat().st_size != want.get("bytes"):
            return None, f"{name} has {path.stat().st_size} bytes, the manifest says {want.get('bytes')}"
        if _sha256_file(path).hexdigest() != want.get("sha256"):
            return None, f"{name} fails its sha256"
    return manifest, None


def _tar_add(tar: tarfile.TarFile, path: Path, arcname: str, skip: set[Path]) -> None:
    """`path` (a file or a folder, recursively) under `arcname`, less the paths in `skip`."""
    if path.resolve() in skip or path.name == SNAKEMAKE_STAMP:
        return
    tar.add(path, arcname=arcname, recursive=False)
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.iterdir()):
            _tar_add(tar, child, f"{arcname}/{child.name}", skip)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def save(
    cache: Path,
    stage: str,
    cell: str,
    key: str,
    parts: dict,
    record: dict,
    out: Path,
    outputs: dict,
    run: dict,
    artifacts: Path | None,
) -> Path:
    """Write the entry of a finished job: `record` (its metrics.json), its folder `out` and declared
    `outputs`, `run` (run_data), the run's artifacts (a folder, or None); atomically (module doc)."""
    entry = entry_path(cache, stage, key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=entry.parent))
    try:
        metrics = Path(outputs["metrics"]).resolve()
        with tarfile.open(tmp / "files.tar", "w") as tar:
            _tar_add(tar, out, "folder", {metrics, metrics.with_name("failed.json")})
            for name, p in sorted(outputs.items()):
                if not _inside(Path(p), out) and Path(p).exists():
                    _tar_add(tar, Path(p), f"outputs/{name}", set())
        (tmp / "record.json").write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
        (tmp / "run.json").write_text(json.dumps(run, sort_keys=True, default=str))
        with tarfile.open(tmp / "artifacts.tar", "w") as tar:
            if artifacts is not None and artifacts.is_dir():
                for child in sorted(artifacts.iterdir()):
                    _tar_add(tar, child, child.name, set())
        pieces = {n: {"sha256": _sha256_file(tmp / n).hexdigest(), "bytes": (tmp / n).stat().st_size} for n in PIECES}
        manifest = {
            "version": VERSION,
            "key": key,
            "parts": parts,
            "stage": stage,
            "cell": cell,
            "status": record.get("status"),
            "run_id": record.get("run_id"),
            "machine": machine_kind(),
            "saved": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "pieces": pieces,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        _replace_dir(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def _replace_dir(new: Path, target: Path) -> None:
    """Put folder `new` at `target` (same file system): a rename; an existing `target` is renamed
    aside first and removed after, so `target` is always either the old folder or the new one."""
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".old-{target.name}-{os.getpid()}-{time.monotonic_ns()}")
        os.replace(target, old)
    try:
        os.replace(new, target)
    except OSError:
        if old is not None and not target.exists():
            os.replace(old, target)
            old = None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def _extract(tar_path: Path, dest: Path) -> None:
    with tarfile.open(tar_path) as tar:
        if hasattr(tarfile, "tar_filter"):  # refuses members outside `dest`, keeps the saved modes
            tar.extractall(dest, filter="tar")
        else:  # pragma: no cover - Python < 3.11.4
            tar.extractall(dest)


def _touch_tree(path: Path, now: float) -> None:
    """Restored files get the restore's time, as freshly computed ones would: Snakemake's mtime
    trigger then orders them after the inputs restored or computed before them."""
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            _touch_tree(child, now)
    if not path.is_symlink():
        os.utime(path, (now, now))


# ---- the MLflow run ---------------------------------------------------------------------------
def run_data(uri: str, run_id: str) -> dict:
    """What a new run needs to stand for `run_id`: its experiment (name, description), its tags,
    params, times and every metric's history, and the same of the runs nested under it."""
    from steps.tracking import store
    from steps.tracking.describe import NOTE

    c = store.client(uri)
    run = store.retrying(c.get_run, run_id)
    exp = store.retrying(c.get_experiment, run.info.experiment_id)

    def one(r) -> dict:
        history = {k: [[m.value, m.timestamp, m.step] for m in store.retrying(c.get_metric_history, r.info.run_id, k)]
                   for k in r.data.metrics}  # fmt: skip
        return {
            "run_id": r.info.run_id,
            "status": r.info.status,
            "start_time": r.info.start_time,
            "end_time": r.info.end_time,
            "tags": dict(r.data.tags),
            "params": dict(r.data.params),
            "metrics": history,
        }

    children = store.retrying(
        c.search_runs, [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'"
    )
    return {
        "experiment": {"name": exp.name, "stage": exp.tags.get("stage", ""), "description": exp.tags.get(NOTE, "")},
        "run": one(run),
        "children": [one(ch) for ch in sorted(children, key=lambda r: r.info.start_time)],
    }


def run_in_store(uri: str, run_id: str | None) -> bool:
    """Whether `run_id` is a finished, active run of the store `uri` (a local SQLite store is read
    with sqlite3, no MLflow import; another store through MLflow)."""
    from steps.tracking.store import local_db

    if not run_id:
        return False
    db = local_db(uri)
    if db is not None:
        if not db.exists():
            return False
        try:
            with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30) as con:
                row = con.execute("SELECT status, lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
        except sqlite3.Error:
            return False
        return row is not None and row == ("FINISHED", "active")
    from steps.tracking import store

    try:
        info = store.client(uri).get_run(run_id).info
    except Exception:  # noqa: BLE001 - not in this store (or unreadable): a new run stands for it
        return False
    return info.status == "FINISHED" and info.lifecycle_stage == "active"


def new_run(uri: str, data: dict, artifacts: Path | None, entry: Path) -> tuple[str, str]:
    """A run in store `uri` standing for the saved run `data` (run_data): nested under this DAG's lab
    run, same tags, params and metric histories, its nested runs and artifacts; tagged
    `restored_from` and `restored_from_cache`. Returns (run id, experiment id)."""
    from mlflow.entities import Metric, Param

    from steps.tracking import store

    c = store.client(uri)
    exp = data["experiment"]
    exp_id = store.experiment_id(c, exp.get("stage") or exp["name"].split("/")[-1], uri, exp.get("description", ""))
    lab = os.environ.get(LAB_RUN_ENV)
    if lab:
        try:
            store.retrying(c.get_run, lab)
        except Exception:  # noqa: BLE001 - another store's lab run: no parent
            lab = None

    def create(saved: dict, parent: str | None, extra: dict) -> str:
        tags = {k: v for k, v in saved["tags"].items() if k not in ("mlflow.parentRunId",)}
        tags.update(extra, restored_from=saved["run_id"], restored_from_cache=str(entry))
        started = time.localtime((saved["start_time"] or 0) / 1000)
        tags["restored_from_time"] = time.strftime("%Y-%m-%d %H:%M:%S %z", started)
        if parent:
            tags["mlflow.parentRunId"] = parent
        with store.write_lock(uri):
            run = store.retrying(c.create_run, exp_id, tags=tags, run_name=tags.get("mlflow.runName"))
        run_id = run.info.run_id
        params = [Param(k, v) for k, v in saved["params"].items()]
        metrics = [Metric(k, v, ts, step) for k, hist in saved["metrics"].items() for v, ts, step in hist]
        for i in range(0, len(params), 100):
            with store.write_lock(uri):
                store.retrying(c.log_batch, run_id, params=params[i : i + 100])
        for i in range(0, len(metrics), 1000):
            with store.write_lock(uri):
                store.retrying(c.log_batch, run_id, metrics=metrics[i : i + 1000])
        return run_id

    run_id = create(data["run"], lab, {})
    for child in data.get("children") or []:
        extra = {"seed_of": run_id} if "seed_of" in child["tags"] else {}
        child_id = create(child, run_id, extra)
        with store.write_lock(uri):
            store.retrying(c.set_terminated, child_id, child["status"])
    if artifacts is not None and any(artifacts.iterdir()):
        store.retrying(c.log_artifacts, run_id, str(artifacts))
    with store.write_lock(uri):
        store.retrying(c.set_terminated, run_id, data["run"]["status"])
    return run_id, exp_id


# ---- the lab run's account of restored jobs ---------------------------------------------------
def note_event(event: dict) -> None:
    """One line in this DAG's lab run's run-cache events (steps/tracking/jobs.py: cache_events),
    which its end reads: restored jobs in its table, corrupt entries printed last."""
    from steps.tracking.jobs import cache_events

    lab = os.environ.get(LAB_RUN_ENV)
    if not lab:
        return
    path = cache_events(lab)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:  # one short write per line: concurrent jobs' lines do not interleave
            f.write(json.dumps(event, sort_keys=True) + "\n")
    except OSError:
        pass


def corrupt_line(entry: Path, what: str) -> str:
    return f"run cache: entry {entry} is corrupt ({what}); recomputing"


# ---- a job's two ends -------------------------------------------------------------------------
class JobCache:
    """The run cache of one job: its key (taken before it runs: its code and inputs as they were
    then), `save` when it ended ok or skipped, `restore` instead of running it."""

    def __init__(self, cache: Path, stage: str, module: str, cfg: dict, inputs: dict, outputs: dict):
        self.cache, self.stage, self.module, self.cfg = cache, stage, module, cfg
        self.cell = cfg.get("cell", "main")
        self.inputs, self.outputs = dict(inputs), dict(outputs)
        self.key, self.parts = key_of(module, cfg, self.inputs, self.outputs)
        self.entry = entry_path(cache, stage, self.key)
        self.uri_configured = ((cfg.get("common") or {}).get("tracking") or {}).get("uri")

    @classmethod
    def of(cls, stage: str, cfg: dict, inputs: dict, outputs: dict) -> "JobCache | None":
        """The run cache of the job of `stage` (`python -m steps.<stage>`, whose code the rule's `code`
        param hashes too), or None: the cache is off, or the key cannot be taken (a line says why)."""
        cache = folder()
        if cache is None:
            return None
        try:
            return cls(cache, stage, f"steps.{stage}", cfg, inputs, outputs)
        except Exception as exc:  # noqa: BLE001 - the job runs without the cache
            print(f"run cache: {stage}: no key ({type(exc).__name__}: {exc}); not cached", file=sys.stderr)
            return None

    @property
    def out(self) -> Path:
        return Path(self.outputs["metrics"]).parent

    def save(self, record: dict) -> Path | None:
        """Keep the finished job (status ok or skipped); never fails the job: a line says why not."""
        if record.get("status") not in ("ok", "skipped"):
            return None
        try:
            from steps.tracking.store import tracking_uri

            uri = tracking_uri(self.uri_configured)
            data = run_data(uri, record["run_id"]) if record.get("run_id") else {}
            with tempfile.TemporaryDirectory(prefix="runcache-artifacts-") as tmp:
                artifacts = None
                if record.get("run_id"):
                    from steps.tracking import store

                    c = store.client(uri)
                    if store.retrying(c.list_artifacts, record["run_id"]):
                        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # the job's log: no bar
                        artifacts = Path(c.download_artifacts(record["run_id"], "", tmp))
                where = (self.cache, self.stage, self.cell, self.key, self.parts)
                entry = save(*where, record, self.out, self.outputs, data, artifacts)
        except Exception as exc:  # noqa: BLE001 - the job's result stands; only its entry is missing
            print(f"run cache: {self.stage}[{self.cell}] not saved ({type(exc).__name__}: {exc})", file=sys.stderr)
            return None
        print(f"run cache: {self.stage}[{self.cell}] saved to {entry}", file=sys.stderr)
        return entry

    def _corrupt(self, what: str) -> None:
        line = corrupt_line(self.entry, what)
        print(line, file=sys.stderr)
        note_event({"event": "corrupt", "stage": self.stage, "cell": self.cell, "line": line})

    def _extracted(self, tmp: Path, name: str, path: Path) -> bool:
        """Whether the extracted entry in `tmp` holds the declared output `name` (metrics.json: the record)."""
        if name == "metrics":
            return True
        if _inside(path, self.out):
            return (tmp / "folder" / path.resolve().relative_to(self.out.resolve())).exists()
        return (tmp / "outputs" / name).exists()

    def restore(self) -> bool:
        """Restore the job from its entry; False (the job runs) where there is none or it fails a check."""
        manifest, problem = check(self.entry, self.key)
        if problem is not None:
            self._corrupt(problem)
            return False
        if manifest is None:
            print(f"run cache: no entry for {self.stage}[{self.cell}] ({self.entry}); computing", file=sys.stderr)
            return False
        if manifest.get("status") == "skipped" and manifest.get("machine") != machine_kind():
            print(f"run cache: {self.entry} is a skip on another kind of machine ({manifest.get('machine')}); "
                  "computing", file=sys.stderr)  # fmt: skip
            return False
        from steps.tracking.store import tracking_uri

        record = json.loads((self.entry / "record.json").read_text())
        uri = tracking_uri(self.uri_configured)
        now = time.time()
        out, metrics = self.out, Path(self.outputs["metrics"])
        stage_tmp = Path(tempfile.mkdtemp(prefix=".runcache-", dir=out.parent))
        try:
            _extract(self.entry / "files.tar", stage_tmp)
            if not (stage_tmp / "folder").is_dir():
                (stage_tmp / "folder").mkdir()
            missing = [name for name, p in self.outputs.items() if not self._extracted(stage_tmp, name, Path(p))]
            if missing:  # every declared output is there, or the job computes (Snakemake would fail it)
                self._corrupt(f"files.tar holds no {', '.join(missing)}")
                return False
            for name, p in self.outputs.items():
                src = stage_tmp / "outputs" / name
                if src.exists():
                    Path(p).parent.mkdir(parents=True, exist_ok=True)
                    _touch_tree(src, now)
                    _replace_dir(src, Path(p))
            _touch_tree(stage_tmp / "folder", now)
            _replace_dir(stage_tmp / "folder", out)
            linked = "the run that computed it"
            original = record.get("run_id")
            if original and not run_in_store(uri, original):
                data = json.loads((self.entry / "run.json").read_text())
                art = stage_tmp / "artifacts"
                art.mkdir()
                _extract(self.entry / "artifacts.tar", art)
                run_id, exp_id = new_run(uri, data, art, self.entry)
                record.update(run_id=run_id, experiment_id=exp_id, restored_from=original)
                linked = f"a new run restored from run {original}"
            if "tracking_uri" in record:  # the store this job logs to (the same string where it is the same store)
                record["tracking_uri"] = uri
        finally:
            shutil.rmtree(stage_tmp, ignore_errors=True)
        tmp = metrics.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str))  # as steps/core/job.py writes it
        tmp.replace(metrics)
        note_event(
            {
                "event": "restored",
                "stage": self.stage,
                "cell": self.cell,
                "status": record.get("status"),
                "run_id": record.get("run_id"),
                "experiment_id": record.get("experiment_id"),
                "restored_from": record.get("restored_from", ""),
                "entry": str(self.entry),
            }
        )
        what = f"{self.stage}[{self.cell}] {record.get('status')}"
        print(f"run cache: {what}: restored from {self.entry} (saved {manifest.get('saved')}); "
              f"its run: {record.get('run_id')}, {linked}", file=sys.stderr)  # fmt: skip
        return True


def main(argv: list[str] | None = None) -> int:
    """`python -m steps.core.runcache <stage> <the stage job's arguments>`: 0 restored, 1 run the job."""
    from steps.core.cli import parse_args

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print("usage: python -m steps.core.runcache STAGE --cfg JSON [--input NAME=PATH] --output NAME=PATH",
              file=sys.stderr)  # fmt: skip
        return 2
    stage, rest = argv[0], argv[1:]
    if folder() is None:
        return 1
    args = parse_args(f"python -m steps.core.runcache {stage}", rest)
    job = JobCache.of(stage, args.cfg, args.inputs, args.outputs)
    try:
        return 0 if job is not None and job.restore() else 1
    except Exception as exc:  # noqa: BLE001 - a restore that cannot finish: the job computes
        print(f"run cache: {stage}: restore failed ({type(exc).__name__}: {exc}); computing", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
