"""StageRun: what a stage's `run(ctx)` gets — its resolved config, its input and output paths (from
the Snakemake rule), the one MLflow run it logs into, and its compute environment.

The MLflow run comes from the job runner (steps/core/job.py: `open_run`, a steps.tracking MlflowRun);
a StageRun built without one (a test, a notebook) logs nothing."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from tqdm.auto import tqdm

from steps.config import config_hash
from steps.core.device import torch_device
from steps.core.seeding import seed_all
from steps.tables import to_markdown


class Untracked:
    """The run of a StageRun built without `open_run`: no store, nothing logged."""

    uri = run_id = experiment_id = None
    last_step = 0

    def start(self, params: dict, common: dict, about: dict | None = None) -> None:
        pass

    def end(self, status: str, reason: str = "") -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def flush(self) -> None:
        pass

    def set_tag(self, key: str, value: Any) -> None:
        pass

    def log_child(self, name: str, params: dict, metrics: dict[str, float], tags: dict | None = None) -> None:
        return None

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass

    def write_lock(self):
        return contextlib.nullcontext()


class StageRun:
    """`inputs`/`outputs`: the rule's named input and output paths (`ctx.inputs["corpus"]`); `out`:
    the job's own folder (where metrics.json goes, beside its tables, plots and files); `open_run`:
    (config hash, seed) -> the run this job logs into (steps/core/job.py passes an MlflowRun)."""

    def __init__(
        self,
        stage: str,
        cell: str,
        params: dict,
        common: dict,
        out: Path,
        open_run: Callable[[str, int], Any] | None = None,
        inputs: Mapping[str, str] | None = None,
        outputs: Mapping[str, str] | None = None,
        about: dict | None = None,
    ):
        self.stage, self.cell, self.params, self.common = stage, cell, params, common
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.inputs: dict[str, str] = dict(inputs or {})
        self.outputs: dict[str, str] = dict(outputs or {})
        self.seed = int(common.get("seed", 0))
        self.threads = int(common.get("threads", 0) or 0)
        self.config_hash = config_hash({"params": params, "common": common})
        self.mlflow = open_run(self.config_hash, self.seed) if open_run else Untracked()
        self.uri = self.mlflow.uri
        self.info: dict[str, Any] = {}
        # what the MLflow run says about itself: module, experiment description, run note
        self.about = {**(about or {}), "inputs": self.inputs}
        self.extra_seed = False  # True in a seed group's further seeds (for_seed): see there

    def for_seed(self, seed: int, run: Any) -> "StageRun":
        """The same cell under another seed of its seed group (steps/core/job.py): its own folder
        (`<out>/seeds/<seed>/`, every output path moved there), its own MLflow run `run` (nested under
        the cell's), its own info. `extra_seed` is True: a stage may skip there what is not an outcome
        of training (benchmarks, exports, samples): the first seed's are the cell's."""
        out = self.out / "seeds" / str(seed)
        twin = StageRun(
            self.stage,
            self.cell,
            self.params,
            {**self.common, "seed": seed},
            out,
            None,
            inputs=self.inputs,
            outputs={k: str(out / Path(v).name) for k, v in self.outputs.items()},
            about=self.about,
        )
        twin.mlflow, twin.uri, twin.threads = run, run.uri, self.threads
        twin.config_hash = self.config_hash  # the cell's: a seed group is one config
        twin.extra_seed = True
        return twin

    # ---- the MLflow run ----------------------------------------------------------------------
    @property
    def run_id(self) -> str | None:
        return self.mlflow.run_id

    @property
    def experiment_id(self) -> str | None:
        return self.mlflow.experiment_id

    def start(self) -> None:
        self.mlflow.start(self.params, self.common, self.about)

    def end(self, status: str, reason: str = "") -> None:
        self.mlflow.end(status, reason)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.mlflow.log_metrics(metrics, step)

    def flush(self) -> None:
        self.mlflow.flush()

    def set_tag(self, key: str, value: Any) -> None:
        self.mlflow.set_tag(key, value)

    def log_child(self, name: str, params: dict, metrics: dict[str, float], tags: dict | None = None) -> str | None:
        """A finished run nested under this job's run (its seeds, say); returns its id."""
        return self.mlflow.log_child(name, params, metrics, tags)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.mlflow.log_artifact(path, artifact_path)

    def write_lock(self):
        """The store's write lock (SQLite has one writer): hold it around a direct MLflow write."""
        return self.mlflow.write_lock()

    # ---- files in the job's folder, logged as artifacts -------------------------------------
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
        kw.setdefault("mininterval", 2.0)
        kw.setdefault("desc", f"{self.stage}:{self.cell}")
        kw.setdefault("dynamic_ncols", True)
        return tqdm(iterable, file=sys.stderr, **kw)

    # ---- environment -------------------------------------------------------------------------
    @property
    def device(self):
        """torch device from common.device (cpu | cuda | auto); CUDA asked for but absent → SkipCell."""
        return torch_device(self.common.get("device", "cpu"))

    def use_threads(self, job_threads: int) -> None:
        """A section's `job_threads` (the cores its rule reserves, workflow/rules/common.smk
        cell_threads; 0 = common.threads): this job's torch intra-op threads follow it."""
        if job_threads:
            self.threads = job_threads
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(job_threads)
        self.info["threads"] = self.threads

    def seed_everything(self, seed: int | None = None) -> None:
        """The job seeds once before `run` (steps.core.job); call again only for another seed."""
        seed_all(self.seed if seed is None else seed, self.threads)
