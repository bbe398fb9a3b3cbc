"""The run context a stage works in: config, seed, device, MLflow logging, outputs."""
from __future__ import annotations

import argparse
import json
import math
import platform
import random
import signal
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable

from steps import paths
from steps.config import ConfigError, config_hash
from steps.tables import to_markdown
from steps.tracking import store

VERSIONED_PACKAGES = ("torch", "jax", "transformers", "datasets", "tokenizers", "mlflow",
                      "snakemake", "numpy", "pandas", "gensim", "accelerate")


class SkipCell(Exception):
    """A declared cell that cannot run here (e.g. needs CUDA): recorded with its reason, not faked."""


class InputError(Exception):
    """Bad input data or paths: shown as one clear message (file, field, fix), no traceback."""


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) or type(v).__name__ in (
        "float32", "float64", "int64", "int32")


class StageRun:
    """What a stage's `run(ctx)` gets: its resolved config and the MLflow run it logs into."""

    def __init__(self, stage: str, cell: str, params: dict, common: dict, out: Path,
                 uri: str | None, log_to_mlflow: bool = True):
        self.stage, self.cell, self.params, self.common = stage, cell, params, common
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.seed = int(common.get("seed", 0))
        self.threads = int(common.get("threads", 0) or 0)
        self.config_hash = config_hash({"params": params, "common": common})
        self.uri = store.tracking_uri(uri)
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._client = None
        self._buffer: list = []
        self._last_flush = time.monotonic()
        self._enabled = log_to_mlflow
        self.info: dict[str, Any] = {}

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if not self._enabled:
            return
        c = self._client = store.client(self.uri)
        self.experiment_id = store.experiment_id(c, self.stage, self.uri)
        self._close_stale_runs()
        tags = {"rule": self.stage, "cell": self.cell, "stage": self.stage,
                "wildcards": json.dumps({"cell": self.cell}), "config_hash": self.config_hash,
                "git_commit": git_commit(), "seed": str(self.seed), "host": platform.node(),
                "mlflow.runName": f"{self.stage}:{self.cell}", "status": "running",
                **{f"version.{k}": v for k, v in package_versions().items()}}
        with store.write_lock(self.uri):
            run = store.retrying(c.create_run, self.experiment_id, tags=tags, run_name=f"{self.stage}:{self.cell}")
        self.run_id = run.info.run_id
        params = {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v)
                  for k, v in flatten(self.params).items()}
        params.update({f"common.{k}": str(v) for k, v in flatten(self.common).items()})
        from mlflow.entities import Param
        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            with store.write_lock(self.uri):
                store.retrying(c.log_batch, self.run_id, params=items[i:i + 100])

    def _close_stale_runs(self) -> None:
        """A job killed outright leaves its run RUNNING: end it FAILED on the next invocation."""
        c = self._client
        stale = store.retrying(
            c.search_runs, [self.experiment_id],
            filter_string=f"tags.cell = '{self.cell}' and attributes.status = 'RUNNING'")
        for r in stale:
            with store.write_lock(self.uri):
                store.retrying(c.set_tag, r.info.run_id, "status", "failed")
                store.retrying(c.set_tag, r.info.run_id, "error", "killed: left RUNNING by an earlier job")
                store.retrying(c.set_terminated, r.info.run_id, "FAILED")

    def end(self, status: str, reason: str = "") -> None:
        if not self.run_id:
            return
        self.flush()
        with store.write_lock(self.uri):
            store.retrying(self._client.set_tag, self.run_id, "status", status)
            if reason:
                key = "error" if status == "failed" else "reason"
                store.retrying(self._client.set_tag, self.run_id, key, reason[:5000])
            store.retrying(self._client.set_terminated, self.run_id,
                           "FAILED" if status == "failed" else "FINISHED")

    # ---- logging ---------------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Buffered; flushed in batches under the store lock (every 5 s, 500 values, or at end)."""
        if not self.run_id:
            return
        from mlflow.entities import Metric
        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if _is_number(v):
                self._buffer.append(Metric(k, float(v), ts, int(step or 0)))
        if len(self._buffer) >= 500 or time.monotonic() - self._last_flush > 5:
            self.flush()

    def flush(self) -> None:
        if not self.run_id or not self._buffer:
            return
        buf, self._buffer = self._buffer, []
        for i in range(0, len(buf), 500):
            with store.write_lock(self.uri):
                store.retrying(self._client.log_batch, self.run_id, metrics=buf[i:i + 500])
        self._last_flush = time.monotonic()

    def set_tag(self, key: str, value: Any) -> None:
        if self.run_id:
            with store.write_lock(self.uri):
                store.retrying(self._client.set_tag, self.run_id, key, str(value)[:5000])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.run_id:
            store.retrying(self._client.log_artifact, self.run_id, str(path), artifact_path)

    def log_table(self, df, name: str) -> Path:
        """Write `<out>/<name>.csv` and `.md` and log both as artifacts."""
        csv, md = self.out / f"{name}.csv", self.out / f"{name}.md"
        df.to_csv(csv, index=False)
        md.write_text(to_markdown(df))
        self.log_artifact(csv, "tables")
        self.log_artifact(md, "tables")
        return csv

    def log_figure(self, fig, name: str) -> Path:
        path = self.out / (name if name.endswith(".png") else f"{name}.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        self.log_artifact(path, "plots")
        return path

    def log_text(self, text: str, name: str) -> Path:
        path = self.out / name
        path.write_text(text)
        self.log_artifact(path)
        return path

    def progress(self, iterable: Iterable | None = None, **kw):
        """A tqdm bar on stderr (the job's log); `mininterval` keeps log files short."""
        from tqdm.auto import tqdm
        kw.setdefault("mininterval", 2.0)
        kw.setdefault("desc", f"{self.stage}:{self.cell}")
        kw.setdefault("dynamic_ncols", True)
        return tqdm(iterable, file=sys.stderr, **kw)

    # ---- environment -----------------------------------------------------------------------
    @property
    def device(self):
        """torch device from common.device (cpu | cuda | auto); CUDA asked for but absent → SkipCell."""
        import torch
        want = self.common.get("device", "cpu")
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want == "cuda" and not torch.cuda.is_available():
            raise SkipCell("skipped: no CUDA")
        return torch.device(want)

    def seed_everything(self, seed: int | None = None) -> None:
        seed = self.seed if seed is None else seed
        random.seed(seed)
        try:
            import numpy as np
            np.random.seed(seed)
        except ImportError:
            pass
        if "torch" in sys.modules:
            import torch
            torch.manual_seed(seed)
            if self.threads:
                torch.set_num_threads(self.threads)


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    tmp.replace(path)  # atomic: a killed job never leaves a half-written metrics.json


def _clean(metrics: dict) -> tuple[dict, dict]:
    numbers, info = {}, {}
    for k, v in (metrics or {}).items():
        if _is_number(v):
            numbers[k] = None if isinstance(v, float) and math.isnan(v) else float(v)
        else:
            info[k] = v
    return numbers, info


def _on_sigterm(signum, frame):
    raise SystemExit(f"killed by signal {signum}")


def stage_main(stage: str, run: Callable[[StageRun], dict], argv: list[str] | None = None) -> None:
    """Entry point of `python -m steps.<stage> --cfg JSON --out DIR`."""
    ap = argparse.ArgumentParser(prog=f"python -m steps.{stage}")
    ap.add_argument("--cfg", required=True, help="resolved cell config as JSON (from the Snakefile)")
    ap.add_argument("--out", required=True, help="output folder; metrics.json is written here")
    ap.add_argument("--no-mlflow", action="store_true", help="run without tracking (debugging)")
    args = ap.parse_args(argv)
    cfg = json.loads(args.cfg)
    common = cfg.get("common", {})
    ctx = StageRun(stage, cfg.get("cell", "main"), cfg.get("params", {}), common, Path(args.out),
                   (common.get("tracking") or {}).get("uri"), log_to_mlflow=not args.no_mlflow)
    metrics_file = ctx.out / "metrics.json"
    failed_file = ctx.out / "failed.json"
    signal.signal(signal.SIGTERM, _on_sigterm)
    t0 = time.time()
    record = {"stage": stage, "cell": ctx.cell, "config_hash": ctx.config_hash,
              "tracking_uri": ctx.uri}
    try:
        ctx.start()
        ctx.seed_everything()
        result = run(ctx) or {}
        numbers, info = _clean(result)
        numbers["wall_time_s"] = round(time.time() - t0, 3)
        ctx.log_metrics({k: v for k, v in numbers.items() if v is not None})
        info.update(ctx.info)
        record.update(status="ok", run_id=ctx.run_id, experiment_id=ctx.experiment_id,
                      metrics=numbers, info=info)
        ctx.end("ok")
    except SkipCell as exc:
        record.update(status="skipped", reason=str(exc), run_id=ctx.run_id,
                      experiment_id=ctx.experiment_id, metrics={}, info=dict(ctx.info))
        ctx.end("skipped", str(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure must end the run FAILED
        expected = isinstance(exc, (InputError, ConfigError, FileNotFoundError, SystemExit,
                                    KeyboardInterrupt))
        message = f"{type(exc).__name__}: {exc}"
        try:
            ctx.end("failed", message)
        finally:
            _write_json(failed_file, {**record, "status": "failed", "run_id": ctx.run_id,
                                      "experiment_id": ctx.experiment_id, "error": message})
        if not expected:
            traceback.print_exc()
        print(f"\n{stage}[{ctx.cell}] failed: {message}", file=sys.stderr)
        sys.exit(1)
    failed_file.unlink(missing_ok=True)
    _write_json(metrics_file, record)
    print(f"{stage}[{ctx.cell}] {record['status']}: run {ctx.run_id} -> {metrics_file}",
          file=sys.stderr)
