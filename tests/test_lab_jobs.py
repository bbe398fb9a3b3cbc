"""The lab run holds the whole story: on a real SQLite store, a lab run of 95 jobs keeps every job in
its jobs.md / jobs.html artifacts (its description alone would be cut at MLflow's 8,000-character
tag limit), counts ok / failed / killed / skipped right, and names the signal of a job that real
Snakemake saw killed by SIGKILL, and of one that caught SIGTERM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from steps.tracking import jobs, lab, store
from tests.conftest import clean_env

SNAKEFILE = """
rule perf:
    output: "results/perf/{cell}/metrics.json"
    log: "results/logs/perf/{cell}.log"
    shell: "python -c 'KILL_SELF' > {log} 2>&1"
""".replace("KILL_SELF", 'import os, signal; print(\\"step 3/10 |###   |\\"); os.kill(os.getpid(), signal.SIGKILL)')
STAGES = ("prepare_corpus", "word2vec", "perf", "sharding", "scale")


def real_snakemake_log(work: Path) -> Path:
    """Snakemake's own log of a job whose process died of SIGKILL (a progress bar was its last line)."""
    (work / "Snakefile").write_text(SNAKEFILE)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "results/perf/k9/metrics.json"]
    done = subprocess.run(cmd, cwd=work, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stderr[-2000:]
    return max((work / ".snakemake" / "log").glob("*.snakemake.log"))


def add_job(c, uri: str, lab_id: str, stage: str, cell: str, status: str, error: str = "") -> str:
    """One job's run nested under the lab run, as steps/tracking/mlflow_run.py leaves it."""
    exp = store.experiment_id(c, stage, uri)
    tags = {"stage": stage, "cell": cell, "status": status, "mlflow.parentRunId": lab_id, "error": error}
    run = c.create_run(exp, tags=tags, run_name=f"{stage}:{cell}")
    if status != "running":  # a job killed outright never closes its run
        c.set_terminated(run.info.run_id, "FAILED" if status == "failed" else "FINISHED")
    return run.info.run_id


@pytest.fixture(scope="module")
def lab_of_95_jobs(tmp_path_factory):
    work = tmp_path_factory.mktemp("lab_jobs")
    log = real_snakemake_log(work)
    uri = f"sqlite:///{work / 'results' / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        lab_id = lab.start(uri, {"seed": 1}, "snakemake --cores 2")
        c = store.client(uri)
        for i in range(90):
            stage = STAGES[i % len(STAGES)]
            add_job(c, uri, lab_id, stage, f"cell_with_a_long_name_{i:03d}", "skipped" if i < 3 else "ok", "")
        add_job(c, uri, lab_id, "perf", "broken", "failed", "ValueError: batch_size must be positive")
        add_job(c, uri, lab_id, "perf", "term", "failed", "SystemExit: killed by signal 15")
        killed = add_job(c, uri, lab_id, "perf", "k9", "running")
        add_job(c, uri, lab_id, "sharding", "orphan", "running")
        add_job(c, uri, lab_id, "scale", "last_job", "ok")
        lab.end(uri, lab_id, "FAILED", str(log))
    return c, lab_id, killed, work, log


def test_every_job_is_in_the_artifacts(lab_of_95_jobs):
    c, lab_id, _, work, _ = lab_of_95_jobs
    md = Path(c.download_artifacts(lab_id, "jobs.md", str(work / "dl"))).read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| stage")]
    assert len(rows) == 95
    assert len(md) > 8000  # more than a tag could hold
    assert "| scale | last_job | ok |" in md
    page = Path(c.download_artifacts(lab_id, "jobs.html", str(work / "dl"))).read_text()
    assert page.count("<tr class=") == 95


def test_counts_and_killed_signals(lab_of_95_jobs):
    c, lab_id, killed, _, _ = lab_of_95_jobs
    run = c.get_run(lab_id)
    assert run.data.metrics == {"jobs_ok": 88, "jobs_skipped": 3, "jobs_failed": 1, "jobs_killed": 3}
    note = run.data.tags["mlflow.note.content"]
    assert "failed (88 ok, 1 failed, 3 killed, 3 skipped)" in note
    assert "jobs.md" in note and "jobs.html" in note and len(note) < 8000
    assert "| perf | k9 | killed (SIGKILL) |" in note
    assert "| perf | term | killed (SIGTERM) |" in note
    assert "| sharding | orphan | killed (signal unknown) |" in note
    assert "| perf | broken | failed |" in note
    k9 = c.get_run(killed)
    assert (k9.info.status, k9.data.tags["status"]) == ("KILLED", "killed")


def test_the_terminal_names_the_signal_not_the_progress_bar(lab_of_95_jobs):
    """What `end` prints last on failure: the killed job with its signal, not its log's last line."""
    *_, work, log = lab_of_95_jobs
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        lines = [line for line, _ in lab.failed_jobs(*lab.snakemake_jobs(str(log)), since=0)]
    assert lines == ["perf[k9] killed (SIGKILL)"]


def test_exit_codes_name_their_signal():
    assert (jobs.exit_signal(137), jobs.exit_signal(-9), jobs.exit_signal(143)) == ("SIGKILL", "SIGKILL", "SIGTERM")
    assert jobs.exit_signal(1) == "" and jobs.exit_signal(0) == ""
