"""The lab run holds the whole story, and each stage opens on its numbers. On a real SQLite store, a
lab run of 95 jobs keeps every job in its jobs.md / jobs.html artifacts (its description alone would
be cut at MLflow's 8,000-character tag limit), counts ok / failed / killed / skipped right, and names
the signal of a job that real Snakemake saw killed by SIGKILL, and of one that caught SIGTERM."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from steps.core.stage import presentation
from steps.tracking import jobs, lab, store, views
from steps.tracking.describe import VIEW_KEY, VIEW_QUERY, ui_url
from steps.tracking.mlflow_run import MlflowRun
from tests.conftest import TINY_TRAIN, clean_env, run_stage, stage_params

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


def test_a_job_its_lifeline_ended_is_killed_not_failed():
    """steps/lifeline.py ends a job whose snakemake died (failed.json 'killed: snakemake (pid N) is
    gone'): the jobs table says killed and why, not failed; a job's own error stays failed."""
    gone = jobs.classify(jobs.Job("perf", "a", "failed", "killed: snakemake (pid 4242) is gone"), "", {})
    assert (gone.status, gone.shown_status) == ("killed", "killed (its snakemake died)")
    own = jobs.classify(jobs.Job("perf", "b", "failed", "ValueError: killed: not a lifeline line"), "", {})
    assert own.status == "failed"


def test_exit_codes_name_their_signal():
    assert (jobs.exit_signal(137), jobs.exit_signal(-9), jobs.exit_signal(143)) == ("SIGKILL", "SIGKILL", "SIGTERM")
    assert jobs.exit_signal(1) == "" and jobs.exit_signal(0) == ""


def test_a_stage_opens_on_its_saved_view(tmp_path, monkeypatch):
    """Jobs run through the real MlflowRun: the perf experiment's saved view shows its headline and the
    params its cells differ in, and sorts the baseline first, then the best speedup."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    lab_id = lab.start(uri, {"seed": 1}, "snakemake --cores 2")
    monkeypatch.setenv("N00BGPT_LAB_RUN", lab_id)
    cells = {"compile": (1.4, True, 1e-3), "baseline": (1.0, False, 1e-3), "amp": (2.1, False, 1e-3)}
    cells |= {"slow": (0.7, False, 1e-3), "broken": (None, True, 1e-3)}
    for cell, (speedup, compile_, lr) in cells.items():
        run = MlflowRun(uri, "perf", cell, "hash", 1)
        run.start({"compile": compile_, "lr": lr, "model": {"n_layer": 2}}, {"seed": 1}, {})
        run.log_metrics({"speedup": speedup, "tokens_per_s": 100.0} if speedup else {})
        run.end("ok" if speedup else "failed", "" if speedup else "ValueError: no")
    lab.end(uri, lab_id, "FINISHED")

    c = store.client(uri)
    exp = c.get_experiment_by_name("n00bgpt/perf")
    saved = json.loads(exp.tags[views.TAG_PREFIX + VIEW_KEY])  # the envelope 3.17's UI reads
    assert saved["name"] == "perf" and isinstance(saved["createdAt"], int)
    view = json.loads(saved["state"])
    assert view["selectedColumns"][:3] == ["tags.`cell`", "tags.`status`", "metrics.`speedup`"]
    assert "params.`compile`" in view["selectedColumns"] and "params.`lr`" not in view["selectedColumns"]
    assert (view["orderByKey"], view["orderByAsc"]) == ("tags.`view_order`", True)
    runs = c.search_runs([exp.experiment_id], order_by=["tags.`view_order` ASC"])
    assert [r.data.tags["cell"] for r in runs] == ["baseline", "amp", "compile", "slow", "broken"]
    assert f"{VIEW_QUERY}" in ui_url("http://h:1", exp.experiment_id)
    lab_view = views.current(c.get_experiment_by_name("n00bgpt/lab"))
    assert "metrics.`jobs_killed`" in lab_view["selectedColumns"]


def test_order_keys_sort_as_numbers():
    values = [-3.5, -1e-9, 0.0, 2e-300, 0.5, 1.0, 7.25, 1e300]
    assert sorted(values, key=views.sortable) == values


def test_training_runs_log_system_metrics_until_they_end(tmp_path, monkeypatch):
    """MLflow's own system metrics on a job run that asks for them; the sampling thread ends with it."""
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = MlflowRun(uri, "gpt_train", "main", "hash", 1)
    run.start({"lr": 1e-3}, {}, {"system_metrics": presentation("gpt_train").system_metrics})
    # the sampler logs after its first interval; on a loaded host that can take longer than a fixed
    # sleep (a 1 s sleep once saw nothing logged), so wait for it, bounded
    wanted, deadline = {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"}, time.time() + 30
    while not wanted <= set(logged := store.client(uri).get_run(run.run_id).data.metrics) and time.time() < deadline:
        time.sleep(0.2)
    run.end("ok")
    assert not [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"]
    assert wanted <= set(logged)
    untracked = MlflowRun(uri, "perf", "main", "hash", 1)
    untracked.start({}, {}, {"system_metrics": presentation("perf").system_metrics})
    untracked.end("ok")
    assert not [k for k in store.client(uri).get_run(untracked.run_id).data.metrics if k.startswith("system/")]


def test_system_metrics_sampling_changes_no_number(gpt_data_dir, monkeypatch):
    """A real gpt_train job sampled every 50 ms and one whose sampler idles (1000 s): the same losses,
    bit for bit; the sampled one has its system metrics. Kept short: RoPE (no HF export), 3 steps
    with one evaluation, no samples (beam search), no bench (TINY_TRAIN)."""
    short = {"max_steps": 3, "warmup_steps": 1, "eval_interval": 3, "ckpt_interval": 3, "samples": {"prompts": []}}
    params = stage_params("gpt_train", **{**TINY_TRAIN, **short})
    params["model"]["pos"] = "rope"
    folder, recs = gpt_data_dir / "results" / "gpt_train" / "sysmetrics", {}
    for interval in ("0.05", "1000"):
        shutil.rmtree(folder, ignore_errors=True)  # no resume from the other run's checkpoint
        monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", interval)
        run_stage(gpt_data_dir, "gpt_train", params, cell="sysmetrics")
        recs[interval] = json.loads((folder / "metrics.json").read_text())
    for key in ("val_loss_initial", "val_loss_final", "steps", "n_params_non_embedding"):
        assert recs["0.05"]["metrics"][key] == recs["1000"]["metrics"][key], key
    c = store.client(f"sqlite:///{gpt_data_dir / 'results' / 'mlflow.db'}")
    assert "system/cpu_utilization_percentage" in c.get_run(recs["0.05"]["run_id"]).data.metrics


def test_seed_runs_sort_right_under_their_cell(tmp_path, monkeypatch):
    """MLflow nests child runs only in a table sorted by time: under the view's sort a cell's seed runs
    are the rows right below it, also where cells tie on the headline (smoke word2vec: all 0)."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    for cell in ("sgd", "gensim"):
        run = MlflowRun(uri, "word2vec", cell, "hash", 1234)
        run.start({"backend": cell}, {"seed": 1234}, {})
        for seed in (1235, 1234):
            run.log_child(f"word2vec:{cell} seed {seed}", {"seed": seed}, {"analogy_acc": 0.0}, {"seed": str(seed)})
        run.log_metrics({"analogy_acc": 0.0})
        run.end("ok")
    c = store.client(uri)
    exp = c.get_experiment_by_name("n00bgpt/word2vec")
    runs = c.search_runs([exp.experiment_id], order_by=["tags.`view_order` ASC"])
    assert [r.info.run_name for r in runs] == [
        "word2vec:gensim",
        "word2vec:gensim seed 1234",
        "word2vec:gensim seed 1235",
        "word2vec:sgd",
        "word2vec:sgd seed 1234",
        "word2vec:sgd seed 1235",
    ]
