"""The real smoke DAG end to end: outputs, the MLflow database, reruns and restarts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from steps.config import load_config
from tests.conftest import (
    DEFAULT,
    SMOKE,
    clean_env,
    job_files,
    mlflow_runs,
    sigint_as_in_a_terminal,
    smoke_cells,
    snakemake,
    snakemake_cmd,
    stage_paths,
)

pytestmark = pytest.mark.slow


def cpu_multiplies_bf16_natively() -> bool:
    """AVX512-BF16 or AMX: perf's bf16 probe finds a native matmul (~2x fp32; without them ~1/100)."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    return "avx512_bf16" in flags or "amx_bf16" in flags


def expected_skips() -> dict[tuple[str, str], str]:
    """The smoke cells that must be skipped on this machine, each with the start of the reason it
    must give. Every other smoke cell must run (status ok): a cell that needs nothing special and
    skips is a failure, and so is one of these that runs where it cannot."""
    assert load_config(DEFAULT, SMOKE)["device"] == "cpu"  # the smoke DAG runs on the CPU, GPU or not
    skips = {("perf", "tf32"): "skipped: needs CUDA (TF32"}  # TF32 is an NVIDIA tensor-core mode
    if not cpu_multiplies_bf16_natively():  # bf16 through a scalar fallback: hours, and says nothing of AMP
        skips[("perf", "amp_bf16")] = "skipped: no native bfloat16 matmul on this CPU"
    return skips


def test_smoke_dag_outputs_and_mlflow_runs(smoke_dag):
    runs = mlflow_runs(smoke_dag).set_index("run_id")
    expected = smoke_cells()
    skips = expected_skips()
    assert set(skips) <= {(s, c) for s, cs in expected.items() for c in cs}, "a renamed cell: update expected_skips"
    seen = 0
    for stage, stage_cells in expected.items():
        for cell in stage_cells:
            path = smoke_dag / stage_paths(stage, cell)[1]["metrics"]
            assert path.exists(), f"{stage}/{cell} produced no metrics.json"
            rec = json.loads(path.read_text())
            if (stage, cell) in skips:
                assert rec["status"] == "skipped" and rec["reason"].startswith(skips[stage, cell]), rec
            else:
                assert rec["status"] == "ok", f"{stage}/{cell} must run on this machine: {rec.get('reason', rec)}"
                assert rec["metrics"], f"{stage}/{cell} ran but recorded no metrics"
            run = runs.loc[rec["run_id"]]
            assert run["status"] == "FINISHED"
            assert run["tags.rule"] == stage and run["tags.cell"] == cell
            assert run["tags.config_hash"] == rec["config_hash"]
            assert run["tags.git_commit"] and run["tags.version.torch"]
            for kind, file in job_files(stage, cell).items():  # every job has its log and benchmark
                assert (smoke_dag / file).exists(), f"{stage}/{cell}: no {kind} {file}"
            seen += 1
    assert seen == sum(len(c) for c in expected.values()) >= 10
    assert (runs["status"] == "RUNNING").sum() == 0
    assert (smoke_dag / stage_paths("prepare_corpus")[1]["data"] / "dataset_dict.json").exists()
    assert (smoke_dag / stage_paths("train_tokenizer")[1]["data"] / "tokenizer.json").exists()


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
    # one job, the one killed, forked by the job server as every local job is: `components` (its parity
    # table, ~5 s of work), no input; prepare_corpus, even on all 775 scenes, ends in ~0.5 s once forked
    # (it ended before the kill landed, its metrics.json written)
    whole = ("--until", "components")
    cmd = snakemake_cmd(tmp_path, *whole)
    metrics = tmp_path / stage_paths("components")[1]["metrics"]
    proc = subprocess.Popen(
        cmd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )

    def running_jobs() -> list[int]:
        """This test's components job (its working dir is tmp_path), while it runs."""
        found = subprocess.run(["pgrep", "-f", "steps.components"], capture_output=True, text=True)
        return [int(p) for p in found.stdout.split() if Path(f"/proc/{p}/cwd").resolve() == tmp_path.resolve()]

    deadline = time.time() + 120
    while time.time() < deadline and not running_jobs() and proc.poll() is None:
        time.sleep(0.1)
    jobs = running_jobs()
    assert jobs, f"components never ran within 120 s:\n{proc.communicate()[0] if proc.poll() is not None else ''}"
    if how == "ctrl-c":
        time.sleep(1.0)  # mid-job
        os.killpg(proc.pid, signal.SIGINT)
    else:
        time.sleep(0.3)
        killed = 0
        for pid in jobs:  # its shell (alive as long as the job) and the python processes under it
            with contextlib.suppress(ProcessLookupError):  # the run-cache check, already done
                os.kill(pid, signal.SIGKILL)
                killed += 1
        assert killed, f"the job {jobs} ended before it could be killed"
    proc.wait(timeout=120)
    assert not metrics.exists()
    snakemake(tmp_path, *whole)
    assert metrics.exists()
