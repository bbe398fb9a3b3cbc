"""The one MLflow run of a job: opened with the reproducibility tags, buffered metric writes under
the store's lock, closed with the job's status. A run a killed job left RUNNING is closed FAILED.

mlflow is imported when a run is opened (store.client), not when this module is: every module
imports `steps.tracking` for its exceptions, and a `--no-mlflow` job never needs it.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from steps.tracking import store
from steps.tracking.provenance import flatten, git_commit, is_number, package_versions


class MlflowRun:
    def __init__(self, uri: str | None, stage: str, cell: str, config_hash: str, seed: int, enabled: bool = True):
        self.uri = store.tracking_uri(uri)
        self.stage, self.cell, self.config_hash, self.seed = stage, cell, config_hash, seed
        self.enabled = enabled
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._client = None
        self._buffer: list = []
        self._last_flush = time.monotonic()

    def start(self, params: dict, common: dict) -> None:
        if not self.enabled:
            return
        c = self._client = store.client(self.uri)
        self.experiment_id = store.experiment_id(c, self.stage, self.uri)
        self._close_stale_runs()
        tags = {
            "rule": self.stage,
            "cell": self.cell,
            "stage": self.stage,
            "wildcards": json.dumps({"cell": self.cell}),
            "config_hash": self.config_hash,
            "git_commit": git_commit(),
            "seed": str(self.seed),
            "host": platform.node(),
            "mlflow.runName": f"{self.stage}:{self.cell}",
            "status": "running",
            **{f"version.{k}": v for k, v in package_versions().items()},
        }
        with store.write_lock(self.uri):
            run = store.retrying(c.create_run, self.experiment_id, tags=tags, run_name=f"{self.stage}:{self.cell}")
        self.run_id = run.info.run_id
        values = {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in flatten(params).items()}
        values.update({f"common.{k}": str(v) for k, v in flatten(common).items()})
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in values.items()]
        for i in range(0, len(items), 100):
            with store.write_lock(self.uri):
                store.retrying(c.log_batch, self.run_id, params=items[i : i + 100])

    def _close_stale_runs(self) -> None:
        """A job killed outright leaves its run RUNNING: end it FAILED on the next invocation."""
        c = self._client
        stale = store.retrying(
            c.search_runs,
            [self.experiment_id],
            filter_string=f"tags.cell = '{self.cell}' and attributes.status = 'RUNNING'",
        )
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
            store.retrying(self._client.set_terminated, self.run_id, "FAILED" if status == "failed" else "FINISHED")

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Buffered; flushed in batches under the store lock (every 5 s, 500 values, or at end)."""
        if not self.run_id:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if is_number(v):
                self._buffer.append(Metric(k, float(v), ts, int(step or 0)))
        if len(self._buffer) >= 500 or time.monotonic() - self._last_flush > 5:
            self.flush()

    def flush(self) -> None:
        if not self.run_id or not self._buffer:
            return
        buf, self._buffer = self._buffer, []
        for i in range(0, len(buf), 500):
            with store.write_lock(self.uri):
                store.retrying(self._client.log_batch, self.run_id, metrics=buf[i : i + 500])
        self._last_flush = time.monotonic()

    def set_tag(self, key: str, value: Any) -> None:
        if self.run_id:
            with store.write_lock(self.uri):
                store.retrying(self._client.set_tag, self.run_id, key, str(value)[:5000])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.run_id:
            store.retrying(self._client.log_artifact, self.run_id, str(path), artifact_path)
