"""A live SLURM cluster on this host (scripts/slurm-local: munged, MariaDB + slurmdbd, slurmctld,
slurmd, and the PostgreSQL-backed MLflow server of scripts/mlflow-server): the smoke DAG through
workflow/profiles/slurm-local, every job submitted with sbatch by snakemake-executor-plugin-slurm,
each in `sacct` with the resources Snakemake gave it and an MLflow run under the one lab run on the
server; the report's deterministic numbers equal the local smoke run's; a job cancelled with
`scancel` mid-run, then a plain rerun completes. Root only (the daemons); CI runs as root."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steps.report.values import report_values
from tests.conftest import NO_SLURM, ROOT, SMOKE, SNAKEFILE, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.live]


@pytest.fixture(autouse=True, scope="module")
def slurm_conf_of_the_cluster():
    """This module talks to the cluster of /etc/slurm: conftest's NO_SLURM is lifted while it runs (for
    snakemake, sacct, squeue, scancel and the scripts alike) and put back after."""
    for key in NO_SLURM:
        os.environ.pop(key)
    yield
    os.environ.update(NO_SLURM)


SLURM_LOCAL = ROOT / "scripts" / "slurm-local"
MLFLOW_SERVER = ROOT / "scripts" / "mlflow-server"
PROFILE = ROOT / "workflow" / "profiles" / "slurm-local"
DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "mariadbd", "munged")


def _script(script: Path, cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(script), cmd], capture_output=True, text=True, timeout=900, env=clean_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"{script.name} {cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _cannot_run_slurmd() -> str:
    """'' where scripts/slurm-local can bring a cluster up here, else why not."""
    if os.geteuid() != 0:
        return "slurmd, slurmctld and /etc/slurm need root"
    if shutil.which("slurmd") is None and shutil.which("apt-get") is None:
        return "no slurmd, and no apt-get to install Debian's slurm-wlm"
    return ""


def _daemons_alive() -> list[str]:
    return [d for d in DAEMONS if subprocess.run(["pgrep", "-x", d], capture_output=True).returncode == 0]


@pytest.fixture(scope="module")
def cluster():
    why = _cannot_run_slurmd()
    if why:
        pytest.skip(why)
    was_up = _script(SLURM_LOCAL, "status", check=False).returncode == 0
    up = _script(SLURM_LOCAL, "up").stdout
    assert _script(SLURM_LOCAL, "up").stdout == up  # idempotent: the same daemons (pids), nothing started twice
    # the CPU partition, this node idle (a node slurmd has just re-registered can show its last
    # state for a few seconds: up to 60 s; the text says which jobs hold it if it stays busy)
    deadline = time.monotonic() + 60
    while not re.search(r"^local\*\s+up\s.*\bidle\b", up, re.M) and time.monotonic() < deadline:
        time.sleep(2)
        up = _script(SLURM_LOCAL, "status", check=False).stdout
    assert re.search(r"^local\*\s+up\s.*\bidle\b", up, re.M), up
    assert re.search(r"^local-gpu\s+up\s.*\s0\s", up, re.M), up  # declared, no nodes
    yield _script(MLFLOW_SERVER, "uri").stdout.strip()
    _script(SLURM_LOCAL, "down")
    assert _daemons_alive() == [], f"still running after down: {_daemons_alive()}"
    assert "down" in _script(MLFLOW_SERVER, "status", check=False).stdout
    if was_up:  # a user's cluster: leave it as it was
        _script(SLURM_LOCAL, "up")


def profile_cmd(work: Path, *args: str) -> list[str]:
    """`snakemake [args] --profile workflow/profiles/slurm-local --configfile configs/smoke.yaml`
    in `work` (args first: --configfile takes every word after it)."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "--directory", str(work), *args]
    return [*cmd, "--profile", str(PROFILE), "--configfile", str(SMOKE)]


def profile_run(work: Path, uri: str, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    """The profile's command, its jobs logging to the cluster's MLflow server."""
    env = {**clean_env(), "MLFLOW_TRACKING_URI": uri}
    return subprocess.run(profile_cmd(work, *args), capture_output=True, text=True, timeout=timeout, env=env, cwd=work)


def submitted(log: str) -> dict[str, dict]:
    """{SLURM job id: the Snakemake job it ran (rule, cell, threads, resources)} from Snakemake's log."""
    jobs, out = {}, {}
    for block in re.split(r"\n(?=\[\w{3} \w{3} )", log):
        rule = re.search(r"^rule (\w+):", block, re.M)
        jobid = re.search(r"^\s+jobid: (\d+)", block, re.M)
        if rule and jobid:
            res = re.search(r"^\s+resources: (.*)$", block, re.M).group(1)
            threads = re.search(r"^\s+threads: (\d+)", block, re.M)
            cell = re.search(r"^\s+wildcards: cell=(\S+)", block, re.M)
            jobs[jobid.group(1)] = {
                "rule": rule.group(1),
                "cell": cell.group(1) if cell else "main",
                "threads": int(threads.group(1)) if threads else 1,
                "resources": dict(kv.split("=", 1) for kv in res.split(", ")),
            }
        for job, slurm_id in re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", block):
            out[slurm_id] = jobs[job]
    return out


def sacct(ids) -> dict[str, dict]:
    fields = "JobID,State,Account,Partition,AllocCPUS,ReqMem,Timelimit,Comment,Elapsed"
    proc = subprocess.run(
        ["sacct", "-X", "-P", "-j", ",".join(ids), "-o", fields], capture_output=True, text=True, check=True
    )
    return {r["JobID"]: r for r in csv.DictReader(proc.stdout.splitlines(), delimiter="|")}


def timelimit(minutes: int) -> str:
    days, rest = divmod(minutes, 1440)
    return (f"{days}-" if days else "") + f"{rest // 60:02d}:{rest % 60:02d}:00"


@pytest.fixture(scope="module")
def slurm_dag(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("slurm_dag")
    start = time.time()
    # A perf job takes every core of a local run (--cores 2 in the smoke run) and the config's
    # `threads` (1) on a cluster; fp32 sums follow torch's intra-op thread count (the perf loss
    # differs in its 7th digit between 1 and 2 threads), so the cluster's perf jobs ask the same 2.
    proc = profile_run(work, cluster, "--set-threads", "perf=2")
    wall = time.time() - start
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-8000:]
    print(f"\nsmoke DAG through the slurm-local profile: {wall:.0f} s wall")
    return work, log


def test_every_job_went_through_sbatch_and_sacct_shows_its_resources(slurm_dag):
    work, log = slurm_dag
    jobs = submitted(log)
    steps = int(re.search(r"(\d+) of \1 steps \(100%\) done", log).group(1))
    # every step but `all` (no shell) was a SLURM job; restarts add jobs, never remove one
    assert len({(j["rule"], j["cell"]) for j in jobs.values()}) == steps - 1, sorted(jobs.items())
    rows = sacct(jobs)
    assert set(rows) == set(jobs), "a submitted job is missing from sacct"
    done = set()
    for slurm_id, job in jobs.items():
        row, res = rows[slurm_id], job["resources"]
        assert row["Account"] == "lab" and row["Partition"] == "local", row
        assert int(row["AllocCPUS"]) == job["threads"], (job, row)
        assert row["ReqMem"] == f"{res['mem_mb']}M", (job, row)
        assert row["Timelimit"] == timelimit(int(res["runtime"])), (job, row)
        assert row["Comment"].startswith(f"rule_{job['rule']}"), row
        if row["State"] == "COMPLETED":
            done.add((job["rule"], job["cell"]))
    assert len(done) == steps - 1  # each step's last attempt completed
    # the profile's runtimes reached SLURM (gpt_train 240 min, sharding 120, the default 60)
    limits = {j["rule"]: rows[i]["Timelimit"] for i, j in jobs.items()}
    assert (limits["gpt_train"], limits["sharding"], limits["report"]) == ("04:00:00", "02:00:00", "01:00:00")


def test_every_job_is_an_mlflow_run_under_one_lab_run_on_the_server(slurm_dag, cluster):
    from mlflow.tracking import MlflowClient

    work, _ = slurm_dag
    client = MlflowClient(cluster)
    lab_exp = client.get_experiment_by_name("n00bgpt/lab")
    labs = client.search_runs([lab_exp.experiment_id], filter_string=f"tags.workdir = '{work.resolve()}'")
    assert len(labs) == 1 and labs[0].info.status == "FINISHED", labs
    lab = labs[0].info.run_id
    exps = [e.experiment_id for e in client.search_experiments()]
    children = {r.info.run_id: r for r in client.search_runs(exps, f"tags.mlflow.parentRunId = '{lab}'")}
    paths = [*(work / "results").glob("*/*/metrics.json"), work / "results/reports/metrics.json"]
    recs = [json.loads(p.read_text()) for p in paths]
    assert len(recs) >= 19 and {r["run_id"] for r in recs} == set(children)
    for rec in recs:
        run = children[rec["run_id"]]
        assert rec["tracking_uri"] == cluster and run.info.status == "FINISHED"
        assert run.data.tags["rule"] == rec["stage"] and run.data.tags["config_hash"] == rec["config_hash"]
    # artifacts travel through the server (--serve-artifacts): no job wrote to a local store
    assert labs[0].info.artifact_uri.startswith("mlflow-artifacts:")
    assert "config.json" in {a.path for a in client.list_artifacts(lab)}
    assert not (work / "results" / "mlflow.db").exists()


def test_report_matches_the_local_smoke_run(slurm_dag, smoke_dag):
    got, want = report_values(slurm_dag[0] / "results"), report_values(smoke_dag / "results")
    assert set(got) == set(want)
    differ = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    print(f"\n{len(want)} deterministic report values compared with the local smoke run; {len(differ)} differ")
    assert len(want) > 200 and not differ, differ


def test_scancel_mid_job_then_a_plain_rerun_completes(slurm_dag, cluster):
    """gpt_train's output asked for again with `-R gpt_train` and the job cancelled while it runs
    (the profile's one automatic restart turned off); the same command without the force reruns it.
    (The whole DAG as target would not: Snakemake leaves a job whose output went missing alone
    while every output downstream of it is present and newer than its inputs.)"""
    work, _ = slurm_dag
    target = "results/gpt_train/main/metrics.json"
    metrics = work / target
    # the first status check 5 s after submission, not 40: the cancellation is seen sooner
    cmd = profile_cmd(work, target, "-R", "gpt_train", "--restart-times", "0")
    cmd += ["--slurm-init-seconds-before-status-checks", "5"]
    env = {**clean_env(), "MLFLOW_TRACKING_URI": cluster}
    proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job, deadline = "", time.time() + 300
    while not job and time.time() < deadline and proc.poll() is None:
        running = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %k"], capture_output=True, text=True)
        job = next((i for i, c in (ln.split() for ln in running.stdout.splitlines()) if "gpt_train" in c), "")
        time.sleep(0.5)
    assert job, "gpt_train never ran"
    time.sleep(3)  # mid-run
    subprocess.run(["scancel", job], check=True)
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode != 0 and "CANCELLED" in out, out[-4000:]
    assert sacct([job])[job]["State"].startswith("CANCELLED")
    assert not metrics.exists()
    rerun = profile_run(work, cluster, target)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-6000:]
    assert json.loads(metrics.read_text())["status"] == "ok"
