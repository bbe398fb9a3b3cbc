"""Shared fixtures: a real Snakemake smoke DAG in a temporary folder (run once per session)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SNAKEFILE = ROOT / "workflow" / "Snakefile"
SMOKE = ROOT / "configs" / "smoke.yaml"


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


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real snakemake CLI on the project's Snakefile inside `workdir`."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "--directory", str(workdir),
           "--cores", "2", "--configfile", str(SMOKE), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    if check and proc.returncode != 0:
        logs = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in (workdir / "results" / "logs").rglob("*.log")
                         if "rror" in p.read_text()) if (workdir / "results" / "logs").exists() else ""
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stderr[-6000:]}\n{logs}")
    return proc


# The DAG's data folders, as the rules name them (workflow/rules/data.smk). `stage_paths` gives a
# stage the inputs and outputs its rule would; test_stage_contract.py checks it against the paths
# Snakemake passes on the smoke DAG.
DAG_DATA = {"prepare_corpus": "results/data/corpus", "train_tokenizer": "results/data/tokenizer",
            "prepare_mcq": "results/data/mcq"}


def stage_paths(stage: str, cell: str, params: dict) -> tuple[dict, dict]:
    """(inputs, outputs) of one job, as its rule passes them (`--input`/`--output NAME=PATH`).
    The report's inputs are every other job's metrics.json, named <stage>/<cell> (not listed here)."""
    if stage == "report":
        return {}, {"index": "results/reports/index.md", "html": "results/reports/index.html",
                    "plots": "results/reports/plots", "metrics": "results/reports/metrics.json"}
    outputs = {"metrics": f"results/{stage}/{cell}/metrics.json"}
    if stage in DAG_DATA:
        outputs["data"] = DAG_DATA[stage]
    corpus = {"corpus": DAG_DATA["prepare_corpus"]}
    inputs = {"train_tokenizer": corpus,
              "gpt_train": {**corpus, "tokenizer": DAG_DATA["train_tokenizer"]},
              "word2vec": {} if params.get("backend") == "pretrained" else
                          {"corpus": params.get("corpus") or DAG_DATA["prepare_corpus"]},
              "mcq_finetune": {"data": params.get("data") or DAG_DATA["prepare_mcq"]},
              "perf": {} if cell == params.get("baseline_cell", cell) else
                      {"baseline": f"results/perf/{params['baseline_cell']}/metrics.json"},
              }.get(stage, {})
    return inputs, outputs


def io_args(inputs: dict, outputs: dict) -> list[str]:
    return ([a for k, v in inputs.items() for a in ("--input", f"{k}={v}")]
            + [a for k, v in outputs.items() for a in ("--output", f"{k}={v}")])


def run_stage(workdir: Path, stage: str, params: dict, cell: str = "main", common: dict | None = None,
              check: bool = True, inputs: dict | None = None,
              outputs: dict | None = None) -> subprocess.CompletedProcess:
    """Run one stage module as Snakemake would (`python -m steps.<stage> --cfg ... --input ...
    --output ...`); paths default to those its rule gives it (`stage_paths`)."""
    cfg = {"stage": stage, "cell": cell, "params": params,
           "common": {"seed": 1234, "device": "cpu", "threads": 1, "tracking": {"uri": None}, **(common or {})}}
    default_in, default_out = stage_paths(stage, cell, params)
    io = io_args(default_in if inputs is None else inputs, {**default_out, **(outputs or {})})
    proc = subprocess.run([sys.executable, "-m", f"steps.{stage}", *io, "--cfg", json.dumps(cfg)],
                          cwd=workdir, capture_output=True, text=True, timeout=600, env=clean_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"{stage} failed:\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory) -> Path:
    """The whole smoke DAG, run once; tests read its outputs and its MLflow database."""
    work = tmp_path_factory.mktemp("smoke_dag")
    snakemake(work)
    return work
