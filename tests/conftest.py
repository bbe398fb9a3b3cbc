"""Shared fixtures and helpers (no test module imports another): a real Snakemake smoke DAG in a
temporary folder (run once per session), running one stage as its job would (forked from a
process that has imported the heavy libraries once: tests/forked_stage.py), the runs in a
job's MLflow store, the perf section around a toy model, a tiny corpus + tokenizer for the GPT
stages, and the CPU-path check of the Triton kernels."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from steps.config import cell_config, cells, load_config, load_schema, validate_config
from tests import forked_stage

ROOT = Path(__file__).resolve().parent.parent
SNAKEFILE = ROOT / "workflow" / "Snakefile"
SMOKE = ROOT / "configs" / "smoke.yaml"
DEFAULT = ROOT / "configs" / "default.yaml"
FULL = ROOT / "configs" / "full.yaml"  # on top of DEFAULT: the cells the default leaves out
GPU = ROOT / "configs" / "gpu.yaml"


# Snakemake loads its SLURM executor plugin at every start, and the plugin asks `scontrol show config`
# for MinJobAge. Where SLURM's client is installed (CI installs it for test_slurm) but no controller
# runs, that call waits out its 10 s timeout: 9-10 s of every `snakemake` and `steps.prefetch` start.
# Tests that use no cluster give SLURM an empty config, so scontrol fails at once; this process too
# (the Snakemake API some tests load in it) and every child. test_slurm lifts it while it runs.
NO_SLURM = {"SLURM_CONF": "/dev/null"}
os.environ.update(NO_SLURM)

# The run cache (steps/core/runcache.py) is off in the tests' jobs, and never the user's ~/.cache: a
# DAG restoring another test's jobs would not run what its test checks. The environment's value is
# the default of a config naming no `cache_dir`; tests/test_runcache.py names one (`--config cache_dir=`).
RUN_CACHE_OFF = {"N00BGPT_RUN_CACHE": "off"}
os.environ.update(RUN_CACHE_OFF)


def clean_env() -> dict:
    """The environment for a child job: MLflow's `set_tracking_uri` exports MLFLOW_TRACKING_URI,
    which would send the child's runs to another test's store."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    # rules run `python -m steps...`: make that the interpreter running the tests
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # ... and this checkout's `steps` the package they run (not another checkout's editable install)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


_BASE_ENV: dict = {}  # the environment the tests start from: run_module's server starts in it


@pytest.fixture(scope="session", autouse=True)
def base_environment():
    """Taken once, after collection (a test module may set a variable as it is imported) and before
    any test: not the environment of whichever test happens to start the server, whose own changes
    would then keep every later test's stages from forking."""
    _BASE_ENV.update(clean_env())


@pytest.fixture(autouse=True)
def environment_as_found():
    """Each test leaves os.environ as it found it, also where the lab's own code changed it in this
    process (steps/mcq/model.py sets HF_HUB_OFFLINE for the process it runs in): a variable left
    behind would reach every later test's jobs, and keep run_module from forking them."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


def sigint_as_in_a_terminal() -> None:
    """preexec_fn of a child that a test Ctrl-Cs: SIGINT at its default, as in a user's terminal. A
    suite started in the background (`pytest ... &` from a script) inherits SIGINT ignored, and a
    child would keep it ignored: Python installs its KeyboardInterrupt handler only over SIG_DFL."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def processes_naming(path: Path) -> list[str]:
    """Pids whose command line or environment names `path` (a failed launch's ranks must all be
    gone; a forked rank's command line is its forkserver's, its environment names the launch's
    folder: N00BGPT_LAUNCH_OUT, steps/sharding/processes.py)."""
    time.sleep(0.5)
    alive = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            if any(str(path).encode() in (proc_dir / f).read_bytes() for f in ("cmdline", "environ")):
                alive.append(proc_dir.name)
        except OSError:
            pass
    return alive


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """The real snakemake CLI on the project's Snakefile and the smoke config, inside `workdir`."""
    snake = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "--directory", str(workdir)]
    return [*snake, "--cores", "2", "--configfile", str(SMOKE), *args]


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real snakemake CLI on the project's Snakefile inside `workdir`."""
    cmd = snakemake_cmd(workdir, *args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    if check and proc.returncode != 0:
        logs = (
            "\n".join(
                f"--- {p}\n{p.read_text()[-3000:]}"
                for p in (workdir / "results" / "logs").rglob("*.log")
                if "rror" in p.read_text()
            )
            if (workdir / "results" / "logs").exists()
            else ""
        )
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stderr[-6000:]}\n{logs}")
    return proc


# ---- the DAG's paths: the workflow's own answer, from Snakemake's API -----------------------------
@functools.cache
def smoke_workflow():
    """The project's workflow on the smoke config as Snakemake parses it (its API, in this process,
    once): tests give a stage the paths its rule gives the job, never paths typed a second time."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, Quietness, ResourceSettings

    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(configfiles=[SMOKE]),
            snakefile=SNAKEFILE,
        )
        return workflow._workflow  # the parsed rules and config (WorkflowApi has no public accessor)


def stage_rules() -> dict[str, str]:
    """{rule: the module it runs} of every stage rule (one with stage_params), in DAG order."""
    return {r.name: f"steps.{r.params.stage}" for r in smoke_workflow().rules if hasattr(r.params, "stage")}


def stage_paths(stage: str, cell: str = "main", params: dict | None = None) -> tuple[dict, dict]:
    """(inputs, outputs) of one job as its rule gives them (`--input`/`--output NAME=PATH`): Snakemake
    applies the rule's own input functions, for the smoke config's `cell`, or, given `params`, for a
    cell `cell` with those resolved params (so declared in the config the rule reads)."""
    from snakemake.iocontainers import Wildcards

    workflow = smoke_workflow()
    rule = workflow.get_rule(stage)
    wildcards = Wildcards(fromdict={"cell": cell} if "cell" in rule.wildcard_names else {})
    section = workflow.config.get(stage)
    if params is not None:
        workflow.config[stage] = {**params, "cells": {cell: {}}}
    try:
        inputs = rule.expand_input(wildcards)[0]
    finally:
        workflow.config[stage] = section
    outputs = rule.expand_output(wildcards)[0]
    return {k: str(v) for k, v in inputs.items()}, {k: str(v) for k, v in outputs.items()}


def job_files(stage: str, cell: str = "main") -> dict[str, str]:
    """A job's log and benchmark files, as its rule names them."""
    from snakemake.iocontainers import Wildcards

    rule = smoke_workflow().get_rule(stage)
    wildcards = Wildcards(fromdict={"cell": cell} if "cell" in rule.wildcard_names else {})
    return {"log": str(rule.expand_log(wildcards)[0]), "benchmark": str(rule.expand_benchmark(wildcards))}


def io_args(inputs: dict, outputs: dict) -> list[str]:
    return [a for k, v in inputs.items() for a in ("--input", f"{k}={v}")] + [
        a for k, v in outputs.items() for a in ("--output", f"{k}={v}")
    ]


def run_module(
    workdir: Path,
    module: str,
    args: list[str],
    timeout: float = 600,
    env_extra: dict | None = None,
    fork: bool = True,
) -> subprocess.CompletedProcess:
    """`python -m <module> <args>` in `workdir` and `clean_env()` plus `env_extra`, forked from
    tests/forked_stage.py's server (the heavy imports done once per test process) where that
    environment allows it (forked_stage.RUN_TIME), else run plainly; `fork=False`: always the real
    command, a fresh interpreter importing everything itself, as Snakemake's rule runs it."""
    env, cmd = {**clean_env(), **(env_extra or {})}, [sys.executable, "-m", module, *args]
    ctx = forked_stage.context(env, _BASE_ENV or clean_env()) if fork else None
    if ctx is None:
        return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        call = (module, args, str(workdir), out, err, env)
        child = ctx.Process(target=forked_stage.stage_main, args=call)
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, child.exitcode, out.read_text(), err.read_text())


def run_stage(
    workdir: Path,
    stage: str,
    params: dict,
    cell: str = "main",
    common: dict | None = None,
    check: bool = True,
    inputs: dict | None = None,
    outputs: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run one stage module as Snakemake would (`python -m steps.<stage> --cfg ... --input ...
    --output ...`); paths default to those its rule gives it (`stage_paths`)."""
    cfg = {
        "stage": stage,
        "cell": cell,
        "params": params,
        "common": {"seed": 1234, "device": "cpu", "threads": 1, "tracking": {"uri": None}, **(common or {})},
    }
    default_in, default_out = stage_paths(stage, cell, params)
    io = io_args(default_in if inputs is None else inputs, {**default_out, **(outputs or {})})
    proc = run_module(workdir, f"steps.{stage}", [*io, "--cfg", json.dumps(cfg)])
    if check and proc.returncode != 0:
        raise AssertionError(f"{stage} failed:\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory) -> Path:
    """The whole smoke DAG, run once per test session, also when pytest-xdist spreads the tests over
    workers: the first worker to need it runs it under a file lock in the folder the workers share
    (xdist gives each worker a subfolder of one base); the others wait and read the same outputs.
    A failed run is not retried by every worker: its error is kept beside it and raised again."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    work, done, failed = shared / "smoke_dag", shared / "smoke_dag.done", shared / "smoke_dag.failed"
    with FileLock(str(shared / "smoke_dag.lock")):
        if not done.exists() and not failed.exists():
            work.mkdir(exist_ok=True)
            try:
                snakemake(work)
            except AssertionError as exc:
                failed.write_text(str(exc))
                raise
            done.touch()
    if failed.exists():
        raise AssertionError(f"the shared smoke DAG failed (in another worker):\n{failed.read_text()}")
    return work


def smoke_params(stage: str, cell: str) -> dict:
    """The resolved params one smoke job sees."""
    return cell_config(load_config(DEFAULT, SMOKE), stage, cell)["params"]


def smoke_cells() -> dict[str, list[str]]:
    """The cells of every stage in the smoke config (tracking, sweep and report are no matrix; a sweep's
    cells are its stage's, steps/config/sweep.py)."""
    cfg = load_config(DEFAULT, SMOKE)
    stages = [
        s
        for s in load_schema()["properties"]
        if isinstance(cfg.get(s), dict) and s not in ("tracking", "sweep", "report")
    ]
    return {s: cells(cfg, s) for s in stages}


def mlflow_runs(workdir: Path):
    """Every run in the job's real SQLite store, as a DataFrame (run_id, status, tags.*, params.*)."""
    import pandas as pd

    from steps.tracking import store

    client = store.client(f"sqlite:///{workdir / 'results' / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    rows = [
        {
            "run_id": r.info.run_id,
            "status": r.info.status,
            **{f"tags.{k}": v for k, v in r.data.tags.items()},
            **{f"params.{k}": v for k, v in r.data.params.items()},
        }
        for r in client.search_runs(exps, max_results=10_000)
    ]
    return pd.DataFrame(rows)


def stage_params(stage: str, **over) -> dict:
    """Schema defaults of a stage's section with `over` merged in (as cell_config would)."""
    cfg = validate_config({stage: over})
    return {k: v for k, v in cfg[stage].items() if k not in ("cells", "select")}


# ---- perf: the default config's perf section around a toy model ---------------------------------
TOY = {"vocab_size": 96, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32}


def perf_section(**over) -> dict:
    """The resolved perf section of the default config with a toy model and `over` applied."""
    cfg = load_config(
        DEFAULT,
        overrides={
            "perf": {
                "model": TOY,
                "batch_size": 4,
                "warmup_steps": 1,
                "timed_steps": 2,
                "peak_matmul_size": 128,
                "cells": {"x": over},
            }
        },
    )
    return cell_config(cfg, "perf", "x")["params"]


def perf_params(**over):
    """perf_section as the stage reads it: steps.perf.config.PerfConfig (imported here: torch)."""
    from steps.perf.config import PerfConfig

    return PerfConfig.of(perf_section(**over))


def check_triton_path_stays_off_on_cpu() -> None:
    """triton is installed (a dependency now): the perf cells must still resolve "auto" to the
    compiled CPU kernels and skip Triton cells with "needs CUDA". Run by test_triton_kernels.py,
    and by triton_interpreted_cases.py under TRITON_INTERPRET=1 (a user's shell may set it).
    torch is imported here, not at the top: this file loads for every test module."""
    import torch

    from steps.core import SkipCell
    from steps.perf import fused
    from steps.perf.step import check_device

    assert not fused.triton_available()
    assert fused.resolve_backend("auto", "cpu") == "compiled"
    with pytest.raises(RuntimeError, match="needs CUDA"):
        fused.resolve_backend("triton", "cpu")
    with pytest.raises(SkipCell, match="needs CUDA"):
        check_device(perf_params(fused_backend="triton"), torch.device("cpu"))


# ---- GPT stages: a tiny corpus + tokenizer laid out like data.smk's outputs ----------------------
WORDS = (
    "the king queen lord lady speaks sleeps sword crown night day love death rose "
    "thou thee art hath doth fair foul sweet bitter"
).split()
TINY_TRAIN = {
    "model": {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32},
    "batch_size": 4,
    "max_steps": 6,
    "warmup_steps": 2,
    "eval_interval": 3,
    "eval_batches": 2,
    "ckpt_interval": 1,
    "samples": {"prompts": ["the king"], "max_new_tokens": 8, "num_beams": 2},
    "bench": {"enabled": False},
}


def tiny_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "." for _ in range(n)]


def make_data(root: Path, vocab_size: int = 300) -> Path:
    """prepare_corpus's data (a DatasetDict train/validation, column text) and train_tokenizer's,
    where their rules put them."""
    import datasets

    from steps.train_tokenizer import train_bpe

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": tiny_texts(300, 0)}),
            "validation": datasets.Dataset.from_dict({"text": tiny_texts(30, 1)}),
        }
    )
    dd.save_to_disk(str(root / stage_paths("prepare_corpus")[1]["data"]))
    train_bpe(dd["train"]["text"], vocab_size, 2).save_pretrained(str(root / stage_paths("train_tokenizer")[1]["data"]))
    return root


@pytest.fixture(scope="module")
def gpt_data_dir(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("gpt_data"))


# ---- sharding: a launched cell against one device ----------------------------------------------
def assert_matches_single_device(p, ranks: list[dict], m: dict) -> None:
    """A cell's ranks (launch) and metrics (summarize) against one device: parity within the plan's
    tolerance on every rank, state and dispatched communication as the analytic model says (p: a
    steps.sharding.plan.Plan). test_sharding's launches and test_scale's gloo cells."""
    backend = p.backend
    # every rank checked itself against one device (a JAX cell: every device's shard, in one record)
    assert len(ranks) == (1 if backend.startswith("jax") else p.world)
    assert "wire_tx_bytes_step" not in m  # one host: no link between hosts to count
    assert all(len(r["dgrad"]) == len(r["dloss"]) == p.steps and "dparam" in r for r in ranks)
    # an fp32 torch rank's tensors each have their own tolerance (parity.rounding_tolerances): >= p.tolerance
    widest = max([o["tol"] for r in ranks for o in r.get("over", {}).values()], default=p.tolerance)
    assert m["parity_max_dloss"] <= widest
    assert m["parity_max_dgrad"] <= widest  # gradients, not only losses (FSDP2-on-gloo report)
    assert m["parity_max_dparam"] <= widest
    assert m["parity_replica_spread"] <= p.tolerance
    assert all(o["ratio"] <= 1 for r in ranks for o in r.get("over", {}).values())
    kinds = ("parity_max_dloss", "parity_max_dgrad", "parity_max_dparam", "parity_replica_spread", "parity_xbackend")
    assert m["parity_err_worst"] <= max(m.get(k, 0.0) for k in kinds) and m["parity_tol"] >= p.tolerance
    assert m["parity_err_over_tol"] == m["parity_err_worst"] / m["parity_tol"]
    assert m["parity_ok"] == 1.0
    assert abs(m["state_ratio"] - 1) <= 0.01
    # GSPMD picks its own collectives, and XLA keeps FSDP gathers from forward to backward (2Ψ):
    # the report shows those ratios; the hand-placed collectives must match the analytic model
    if backend.startswith("torch") or (backend == "jax_shard_map" and "fsdp" not in p.strategy):
        assert abs(m["dispatch_comm_ratio"] - 1) <= 0.05
    else:  # still measured: the compiled HLO's collectives were found and counted
        assert 0 < m["dispatch_comm_ratio"] < 2 and m["dispatch_comm_bytes_step"] > 0
    if backend.startswith("jax"):  # torch's single-device run of the same plan decides too (cross_backend's default)
        assert m["xbackend_max_dparam"] <= p.tolerance and m["xbackend_max_dloss"] <= p.tolerance
        assert m["parity_xbackend"] == max(m["xbackend_max_dparam"], m["xbackend_max_dloss"])
