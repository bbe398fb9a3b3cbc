"""The one MLflow run of a job: opened with the reproducibility tags and MLflow's own conventions
(source, git commit, note, parent lab run, datasets read), buffered metric writes under the store's
lock, closed with the job's status. A run a killed job left RUNNING is closed FAILED. Child runs
(e.g. word2vec's seeds) are nested under it.

mlflow is imported when a run is opened (store.client), not when this module is: every job imports
this module (steps/core/job.py), and a `--no-mlflow` job never needs mlflow.
"""

from __future__ import annotations

import getpass
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from steps.tracking import store, views
from steps.tracking.datasets import dataset_inputs
from steps.tracking.describe import NOTE
from steps.tracking.provenance import flatten, git_commit, is_number, package_versions

# The lab run of this DAG invocation (workflow/Snakefile, onstart): jobs nest their runs under it.
LAB_RUN_ENV = "N00BGPT_LAB_RUN"


class MlflowRun:
    def __init__(
        self,
        uri: str | None,
        stage: str,
        cell: str,
        config_hash: str,
        seed: int,
        enabled: bool = True,
        parent: "MlflowRun | None" = None,
    ):
        self.uri = store.tracking_uri(uri)
        self.stage, self.cell, self.config_hash, self.seed = stage, cell, config_hash, seed
        self.enabled = enabled
        self.parent = parent  # a seed's run: nested under its cell's run, not the lab run
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._client = None
        self._source: dict[str, str] = {}
        self._buffer: list = []
        self._last_flush = time.monotonic()
        self._latest: dict[str, float] = {}  # each metric's last value: the run's `view_order` (views.py)
        self.last_step = 0  # the highest step logged: a seed group's means go there (the run's latest value)
        self._system = None  # MLflow's SystemMetricsMonitor, for stages that train (about["system_metrics"])
        self._sweep: dict[str, str] = {}  # a sweep cell's tags (start)

    def start(self, params: dict, common: dict, about: dict | None = None) -> None:
        """`about`: module (mlflow.source.name), description (the experiment's), note (the run's),
        inputs (the job's named input paths, logged as datasets)."""
        if not self.enabled:
            return
        about = about or {}
        c = self._client = store.client(self.uri)
        self.experiment_id = store.experiment_id(c, self.stage, self.uri, about.get("description", ""))
        # a sweep's cell (steps/config/sweep.py): `sweep`, `sweep_value`, `sweep_order` on it and its seeds' runs
        self._sweep = {k: str(v) for k, v in (about.get("sweep") or {}).items()}
        if self.parent is None:  # a seed's run starts inside its cell's job: nothing stale to close
            self._close_stale_runs()
            self._save_view()
        commit = git_commit()
        parent = self.parent.run_id if self.parent is not None else self._lab_run()
        name = f"{self.stage}:{self.cell}" + (f" seed {self.seed}" if self.parent is not None else "")
        tags = {
            "rule": self.stage,
            "cell": self.cell,
            "stage": self.stage,
            "wildcards": json.dumps({"cell": self.cell}),
            "config_hash": self.config_hash,
            "git_commit": commit,
            "seed": str(self.seed),
            "host": platform.node(),
            "mlflow.runName": name,
            **({"seed_of": self.parent.run_id} if self.parent is not None else {}),
            **self._sweep,
            "mlflow.source.name": about.get("module") or f"steps.{self.stage}",
            "mlflow.source.type": "JOB" if parent else "LOCAL",
            "mlflow.user": getpass.getuser(),
            "status": "running",
            **({"mlflow.source.git.commit": commit.removesuffix("-dirty")} if commit != "unknown" else {}),
            **({"mlflow.parentRunId": parent} if parent else {}),
            **({NOTE: about["note"]} if about.get("note") else {}),
            **{f"version.{k}": v for k, v in package_versions().items()},
        }
        self._source = {k: v for k, v in tags.items() if k.startswith(("mlflow.source.", "mlflow.user"))}
        with store.write_lock(self.uri):
            run = store.retrying(c.create_run, self.experiment_id, tags=tags, run_name=name)
        self.run_id = run.info.run_id
        shown = about.get("params_shown", params)  # the Stage's params_used (steps/core/stage.py)
        values = {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in flatten(shown).items()}
        values.update({f"common.{k}": str(v) for k, v in flatten(common).items()})
        self._log_params(self.run_id, values)
        if about.get("system_metrics") and self.parent is None:
            self._start_system_metrics()
        datasets = dataset_inputs(about.get("inputs") or {})
        if datasets:
            with store.write_lock(self.uri):
                store.retrying(c.log_inputs, self.run_id, datasets=datasets)

    def _start_system_metrics(self) -> None:
        """MLflow's own system metrics (system/cpu_utilization_percentage, memory, disk, network; GPU
        where pynvml finds one) sampled by its thread every MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
        seconds (10): one psutil read and one small batch each, off the training thread, nothing
        it computes. Its writes take the store's lock like ours; `end` stops the thread."""
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(self.run_id, tracking_uri=self.uri)
        except Exception as exc:  # noqa: BLE001 - e.g. psutil missing: the run goes on without them
            print(f"MLflow system metrics off: {type(exc).__name__}: {exc}")
            return
        client, log_batch = monitor.mlflow_logger.client, monitor.mlflow_logger.client.log_batch

        def locked_log_batch(*args, **kwargs):
            with store.write_lock(self.uri):
                return store.retrying(log_batch, *args, **kwargs)

        client.log_batch = locked_log_batch
        monitor.start()
        self._system = monitor

    def _save_view(self) -> None:
        """The experiment's saved runs view (views.py), where it has none yet: the lab run's end writes
        it again with the params its cells differ in."""
        try:
            view = views.stage_view(self.stage)
        except LookupError:  # a stage with no presentation module: MLflow's own columns
            return
        with store.write_lock(self.uri):
            store.retrying(views.save, self._client, self.experiment_id, view, self.stage, only_if_missing=True)
        if self._sweep:  # the sweep's own view: its runs by value (views.sweep_view)
            key = self._sweep["sweep"]
            with store.write_lock(self.uri):
                store.retrying(
                    views.save, self._client, self.experiment_id, views.sweep_view(self.stage, key),
                    f"sweep {key}", key=views.sweep_key(key),
                )  # fmt: skip

    def _log_params(self, run_id: str, values: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in values.items()]
        for i in range(0, len(items), 100):
            with store.write_lock(self.uri):
                store.retrying(self._client.log_batch, run_id, params=items[i : i + 100])

    def _lab_run(self) -> str | None:
        """The DAG invocation's lab run, if this job runs under one in the same store."""
        run_id = os.environ.get(LAB_RUN_ENV)
        if not run_id:
            return None
        try:
            self._client.get_run(run_id)
        except Exception:  # another store (a job pointed elsewhere) or a deleted run: no parent
            return None
        return run_id

    def seed_run(self, seed: int) -> "MlflowRun":
        """The run of one further seed of this cell's seed group, nested under this run (started by
        the caller with `start`, ended with `end`, like this one)."""
        enabled = self.enabled and bool(self.run_id)
        return MlflowRun(self.uri, self.stage, self.cell, self.config_hash, seed, enabled, parent=self)

    def log_child(self, name: str, params: dict, metrics: dict[str, float], tags: dict | None = None) -> str | None:
        """A finished child run nested under this one, in the same experiment (one per seed, say)."""
        if not self.run_id:
            return None
        from mlflow.entities import Metric

        base = {"stage": self.stage, "cell": self.cell, "config_hash": self.config_hash, **self._source, **self._sweep}
        child_tags = {**base, **(tags or {}), "mlflow.parentRunId": self.run_id, "mlflow.runName": name}
        with store.write_lock(self.uri):
            child = store.retrying(self._client.create_run, self.experiment_id, tags=child_tags, run_name=name)
        run_id = child.info.run_id
        self._log_params(run_id, {k: str(v) for k, v in params.items()})
        ts = int(time.time() * 1000)
        with store.write_lock(self.uri):
            batch = [Metric(k, float(v), ts, 0) for k, v in metrics.items() if is_number(v)]
            store.retrying(self._client.log_batch, run_id, metrics=batch)
            store.retrying(self._client.set_terminated, run_id, "FINISHED")
        return run_id

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
        if self._system is not None:  # before the lock: its last write waits for it
            self._system.finish()
            self._system = None
        self.flush()
        with store.write_lock(self.uri):
            store.retrying(self._client.set_tag, self.run_id, "status", status)
            if self.parent is None:  # a seed's run sorts under its cell's (set below, by the cell's end)
                order = views.order_key(self.stage, self.cell, self._latest if status == "ok" else {})
                store.retrying(self._client.set_tag, self.run_id, views.ORDER_TAG, order)
                self._order_children(order)
            if status == "skipped":  # MLflow has no such state: FINISHED, and the name says it
                name = f"{self.stage}:{self.cell} (skipped)"
                store.retrying(self._client.set_tag, self.run_id, "mlflow.runName", name)
            if reason:
                key = "error" if status == "failed" else "reason"
                store.retrying(self._client.set_tag, self.run_id, key, reason[:5000])
            store.retrying(self._client.set_terminated, self.run_id, "FAILED" if status == "failed" else "FINISHED")

    def _order_children(self, order: str) -> None:
        """Each child run (a seed's) sorts right under this one (views.seed_order_key); held lock."""
        children = store.retrying(
            self._client.search_runs,
            [self.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.run_id}'",
            max_results=1000,
        )
        for child in children:
            seed = child.data.tags.get("seed", "")
            key = views.seed_order_key(order, int(seed)) if seed.isdigit() else f"{order} | {child.info.run_name}"
            store.retrying(self._client.set_tag, child.info.run_id, views.ORDER_TAG, key)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Buffered; flushed in batches under the store lock (every 5 s, 500 values, or at end)."""
        if not self.run_id:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self.last_step = max(self.last_step, int(step or 0))
        for k, v in metrics.items():
            if is_number(v):
                self._buffer.append(Metric(k, float(v), ts, int(step or 0)))
                self._latest[k] = float(v)
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

    def write_lock(self):
        return store.write_lock(self.uri)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.run_id:
            store.retrying(self._client.log_artifact, self.run_id, str(path), artifact_path)
