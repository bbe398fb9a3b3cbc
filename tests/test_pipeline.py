"""The real smoke DAG end to end: outputs, the MLflow database, reruns and restarts."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import clean_env, mlflow_runs, smoke_cells, snakemake, snakemake_cmd

pytestmark = pytest.mark.slow


def test_smoke_dag_outputs_and_mlflow_runs(smoke_dag):
    runs = mlflow_runs(smoke_dag).set_index("run_id")
    expected = smoke_cells()
    seen = 0
    for stage, stage_cells in expected.items():
        for cell in stage_cells:
            path = smoke_dag / "results" / stage / cell / "metrics.json"
            assert path.exists(), f"{stage}/{cell} produced no metrics.json"
            rec = json.loads(path.read_text())
            assert rec["status"] in ("ok", "skipped"), rec
            run = runs.loc[rec["run_id"]]
            assert run["status"] == "FINISHED"
            assert run["tags.rule"] == stage and run["tags.cell"] == cell
            assert run["tags.config_hash"] == rec["config_hash"]
            assert run["tags.git_commit"] and run["tags.version.torch"]
            seen += 1
    assert seen >= 3
    assert (runs["status"] == "RUNNING").sum() == 0
    assert (smoke_dag / "results/data/corpus/dataset_dict.json").exists()
    assert (smoke_dag / "results/data/tokenizer/tokenizer.json").exists()
    for stage in expected:  # every rule has its log and benchmark
        assert list((smoke_dag / "results/logs" / stage).glob("*.log")), stage
        assert list((smoke_dag / "results/benchmarks" / stage).glob("*.tsv")), stage


def test_report_lists_every_declared_cell(smoke_dag):
    index = (smoke_dag / "results/reports/index.md").read_text()
    for stage, stage_cells in smoke_cells().items():
        assert f"## {stage}" in index and f"| {stage} |" in index
        table = (smoke_dag / "results/reports" / f"{stage}.md").read_text()
        for cell in stage_cells:
            assert f"| {cell} |" in table, (stage, cell)


def test_nothing_to_do_when_nothing_changed(smoke_dag):
    proc = snakemake(smoke_dag, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_forcerun_one_stage_plans_only_it_and_dependents(smoke_dag):
    proc = snakemake(smoke_dag, "-n", "-R", "train_tokenizer")
    out = proc.stdout + proc.stderr
    assert "rule train_tokenizer:" in out
    assert "rule prepare_corpus:" not in out and "rule prepare_mcq:" not in out
    assert "rule report:" in out


@pytest.mark.parametrize("how", ["ctrl-c", "job-killed"])
def test_killed_dag_restarts_without_cleanup(tmp_path, how):
    """Ctrl-C on the DAG (SIGINT to the process group), or the running job killed outright
    (SIGKILL, as the OOM killer does): the next plain invocation completes."""
    cmd = snakemake_cmd(tmp_path, "--until", "train_tokenizer")
    proc = subprocess.Popen(
        cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    log = tmp_path / "results/logs/prepare_corpus/main.log"
    deadline = time.time() + 120
    while time.time() < deadline and not log.exists():
        time.sleep(0.2)
    time.sleep(1.0)  # mid-job
    import os

    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        job = subprocess.run(["pgrep", "-f", "steps.prepare_corpus"], capture_output=True, text=True)
        for pid in job.stdout.split():  # only this test's job: its working dir is tmp_path
            if Path(f"/proc/{pid}/cwd").resolve() == tmp_path.resolve():
                os.kill(int(pid), signal.SIGKILL)
    proc.wait(timeout=120)
    assert not (tmp_path / "results/train_tokenizer/main/metrics.json").exists()
    snakemake(tmp_path, "--until", "train_tokenizer")
    assert (tmp_path / "results/train_tokenizer/main/metrics.json").exists()
