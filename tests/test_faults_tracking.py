"""Faults as a user meets them (issue 33: a dead tracking server, a crafted checkpoint, a killed
`snakemake`), with real processes: the real snakemake CLI, a real `mlflow server` killed mid-run,
real signals. The long-running job is a tiny stage module of this file's own (`ticker`, written
into the test's folder), run by the lab's own job runner (steps/core/job.py) under a one-rule
Snakefile: it logs a metric twice a second until its `seconds` pass or a file `go` appears."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from steps.core.errors import InputError
from steps.tracking import store
from steps.tracking.server import unreachable
from steps.ui import free_port
from tests.conftest import clean_env, processes_naming, run_module, sigint_as_in_a_terminal, snakemake_cmd

TICKER = '''"""A test stage: logs `tick` twice a second until `seconds` pass or the file `go` appears."""
import time
from pathlib import Path

from steps.core.stage import Presentation, Stage


def run(ctx):
    t0, i = time.time(), 0
    while time.time() - t0 < ctx.params["seconds"] and not Path("go").exists():
        ctx.log_metrics({"tick": i}, step=i)
        ctx.flush()
        (ctx.out / "started").touch()
        i += 1
        time.sleep(0.5)
    return {"ticks": i}


STAGE = Stage.of(__spec__.name, run, Presentation())

if __name__ == "__main__":
    STAGE.main()
'''

# A stage that starts and steps as a big one does: `import steps` first, as `python -m steps.<stage>`
# does; then a slow import (torch's, transformers' and datasets' take ~15 s on a loaded 2-core host: a
# sleep of SLOW_IMPORT_S here, the file `importing` marking it); then each tick is one long computation
# in C that handles no signal until it returns (a training step's: PBKDF2 here), until `go` appears.
SLOW_JOB = '''"""A test stage: a slow import, then ticks of one long computation in C each."""
import steps  # noqa: F401

import hashlib
import os
import time
from pathlib import Path

Path("importing").touch()
time.sleep(float(os.environ.get("SLOW_IMPORT_S", "0")))

from steps.core.stage import Presentation, Stage  # noqa: E402


def run(ctx):
    i = 0
    while not Path("go").exists():
        ctx.log_metrics({"tick": i}, step=i)
        ctx.flush()
        (ctx.out / "started").touch()
        hashlib.pbkdf2_hmac("sha256", b"key", b"salt", ctx.params["iterations"])
        i += 1
    return {"ticks": i}


STAGE = Stage.of(__spec__.name, run, Presentation())

if __name__ == "__main__":
    STAGE.main()
'''

SNAKEFILE = """rule ticker:
    output: "results/ticker/main/metrics.json"
    log: "ticker.log"
    params: cfg=CFG
    shell: "ENV python -m MODULE --output metrics={output} --cfg {params.cfg:q} > {log} 2>&1THEN"
"""


def ticker_workflow(
    work: Path,
    seconds: float,
    uri: str | None = None,
    module: str = "ticker",
    env: str = "",
    then: str = "",
    **params,
) -> list[str]:
    """A one-job workflow in `work` running the ticker stage (or `module`: slowjob, SLOW_JOB, with
    `env` before its command, `then` after it in the shell line, and `params`); returns its snakemake
    command. The job's command line names `work` (its config's `tag`), so its processes can be found."""
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{module}.py").write_text({"ticker": TICKER, "slowjob": SLOW_JOB}[module])
    cfg = {
        "stage": "ticker",
        "cell": "main",
        "params": {"seconds": seconds, "tag": str(work), **params},
        "common": {"seed": 0, "device": "cpu", "threads": 1, "tracking": {"uri": uri}},
    }
    text = SNAKEFILE.replace("CFG", repr(json.dumps(cfg))).replace("MODULE", module).replace("THEN", then)
    text = text.replace("ENV ", env and f"{env} ")
    (work / "Snakefile").write_text(text)
    return [sys.executable, "-m", "snakemake", "-s", str(work / "Snakefile"), "--directory", str(work), "--cores", "1"]


def wait_for(check, what: str, timeout: float) -> float:
    """Seconds until `check()` is true; fails after `timeout`."""
    t0 = time.time()
    while not check():
        assert time.time() - t0 < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.2)
    return time.time() - t0


def dead_port() -> int:
    """A local port nothing listens on (free_port binds it and lets it go)."""
    return free_port()


# ---- a dead or lost tracking server ---------------------------------------------------------------
@pytest.mark.slow
def test_dead_tracking_uri_stops_the_dag_before_any_job(tmp_path):
    uri = f"http://127.0.0.1:{dead_port()}"
    cmd = snakemake_cmd(tmp_path, "--config", f"tracking={json.dumps({'uri': uri})}", "--until", "prepare_corpus")
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env())
    elapsed = time.time() - t0
    assert proc.returncode != 0 and elapsed < 60, (elapsed, proc.stderr[-3000:])
    lines = [ln for ln in proc.stderr.splitlines() if f"tracking server {uri}" in ln]
    assert len(lines) == 1 and "does not answer" in lines[0] and "fix: start it" in lines[0], proc.stderr[-3000:]
    assert "drop tracking.uri" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("metrics.json"))
    assert not (tmp_path / "results" / "logs").exists(), "a job started"


@pytest.fixture
def mlflow_server(tmp_path):
    """A real `mlflow server` in its own session (its workers die with the group); yields (uri, proc)."""
    root = tmp_path / "server"
    root.mkdir()
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"]
    cmd += ["--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--workers", "1"],
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, "mlflow server exited"
        try:
            return urllib.request.urlopen(f"{uri}/health", timeout=2).status == 200
        except OSError:
            return False

    wait_for(up, "mlflow server", 180)
    yield uri, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# the bound docs/tracking.md states for a lost server (tests/test_published.py checks the page says it):
# MLflow's client gets 3 tries of 15 s a call (steps/tracking/store.py), a hung server costs the most
LOST_SERVER_S = 120


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "hung"])
def test_server_lost_mid_run_fails_the_job_with_one_line(tmp_path, mlflow_server, how):
    """A server killed (connections refused) or hung (SIGSTOP: the kernel still accepts connections,
    nothing answers them; a read times out) while a job logs to it fails the job with one line within
    LOST_SERVER_S."""
    uri, server = mlflow_server
    work = tmp_path / "work"
    dag = subprocess.Popen(
        ticker_workflow(work, seconds=600, uri=uri),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: (work / "results/ticker/main/started").exists(), "the job logging to the server", 180)
        if how == "killed":
            os.killpg(server.pid, signal.SIGKILL)  # the server and its workers, as an OOM kill would
            server.wait()
        else:
            os.killpg(server.pid, signal.SIGSTOP)  # listening, accepting (the kernel does), never answering
        t0 = time.time()
        out, _ = dag.communicate(timeout=300)
        elapsed = time.time() - t0
    finally:
        if dag.poll() is None:
            dag.kill()
    print(f"{how}: the DAG stopped {elapsed:.1f} s after the server was lost")
    assert dag.returncode != 0 and elapsed < LOST_SERVER_S, (elapsed, out[-2000:])
    log = (work / "ticker.log").read_text()
    line = f"the MLflow tracking server {uri} stopped answering during the job"
    assert f"ticker[main] failed: {line}" in log and "fix: start it" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    failed = json.loads((work / "results/ticker/main/failed.json").read_text())
    assert failed["status"] == "failed" and failed["error"].startswith(line)
    assert not (work / "results/ticker/main/metrics.json").exists()


def test_retrying_retries_sqlite_locks_never_a_refused_connection(monkeypatch):
    calls = []

    def locked_twice():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "done"

    assert store.retrying(locked_twice) == "done" and len(calls) == 3

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries aside
    uri, attempts = f"http://127.0.0.1:{dead_port()}", []
    client = MlflowClient(uri)

    def refused():
        attempts.append(1)
        return client.search_experiments(max_results=1)

    with pytest.raises(Exception, match="Connection refused") as lost:
        store.retrying(refused)
    assert len(attempts) == 1
    # the job's one line names this server; a refused connection elsewhere (gloo, a hub) is not it
    assert unreachable(lost.value, uri).endswith("results/mlflow.db")
    assert unreachable(RuntimeError("gloo rendezvous: Connection refused"), "http://127.0.0.1:9") is None


# ---- snakemake killed outright ---------------------------------------------------------------------
@pytest.mark.slow
def test_job_dies_with_a_killed_snakemake_and_a_rerun_recovers(tmp_path):
    work = tmp_path / "work"
    cmd = ticker_workflow(work, seconds=600)
    dag = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (work / "results/ticker/main/started").exists(), "the job", 180)
    job = [p for p in processes_naming(work) if p != str(dag.pid)]
    assert job, "the job's processes were not found by their command line"
    dag.send_signal(signal.SIGKILL)
    dag.wait()
    gone = wait_for(lambda: not [p for p in processes_naming(work) if p in job], "the job gone", 30)
    assert gone < 5
    failed = json.loads((work / "results/ticker/main/failed.json").read_text())
    assert failed["error"] == f"killed: snakemake (pid {dag.pid}) is gone"
    assert f"snakemake (pid {dag.pid}) is gone" in (work / "ticker.log").read_text()
    assert not (work / "results/ticker/main/metrics.json").exists()

    (work / "go").touch()  # the rerun's job ends at once
    subprocess.run([*cmd, "--unlock"], env=clean_env(), capture_output=True, timeout=300, check=True)
    rerun = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    rec = json.loads((work / "results/ticker/main/metrics.json").read_text())
    assert rec["status"] == "ok" and not (work / "results/ticker/main/failed.json").exists()


def run_status(work: Path, run_id: str) -> str:
    """The MLflow status of `run_id` in the workflow's local store."""
    return store.client(f"sqlite:///{work / 'results' / 'mlflow.db'}").get_run(run_id).info.status


@pytest.mark.slow
@pytest.mark.parametrize("when", ["mid_step", "mid_import"])
def test_a_killed_snakemake_stops_its_job_within_5_s(tmp_path, when):
    """kill -9 of snakemake while its job computes a step in C (no signal handled for ~30 s, as a
    training step's matmuls) or while it still imports its libraries (before its own code runs): the
    job, its shell and its computation are gone within 5 s, its MLflow run (if it had one) ends FAILED
    from the lifeline without waiting for the step, it writes no metrics.json, and its shell runs
    nothing after it (the project's line is `runcache || job`)."""
    work = tmp_path / "work"
    slow_import = "SLOW_IMPORT_S=60" if when == "mid_import" else ""
    then = " || touch after_the_job"
    cmd = ticker_workflow(work, 600, module="slowjob", env=slow_import, then=then, iterations=40_000_000)
    dag = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        marker = work / ("importing" if when == "mid_import" else "results/ticker/main/started")
        wait_for(marker.exists, f"the job {when.replace('_', ' ')}", 180)
        time.sleep(1)
        job = [p for p in processes_naming(work) if p != str(dag.pid)]
        assert job, "the job's processes were not found by their command line"
        dag.send_signal(signal.SIGKILL)
        dag.wait()
        t0 = time.time()
        wait_for(lambda: not [p for p in processes_naming(work) if p in job], "the job gone", 120)
        gone = time.time() - t0
    finally:
        if dag.poll() is None:
            dag.kill()
        (work / "go").touch()  # a job that outlived its snakemake stops at its next tick
    print(f"{when}: the job was gone {gone:.1f} s after snakemake's SIGKILL")
    assert gone < 5, f"{when}: the job ran on for {gone:.1f} s after its snakemake was killed"
    out = work / "results/ticker/main"
    time.sleep(1)
    assert not (out / "metrics.json").exists() and not (work / "after_the_job").exists()
    log = (work / "ticker.log").read_text()
    assert f"snakemake (pid {dag.pid}) is gone" in log
    if when == "mid_step":  # it had its run: FAILED, and failed.json says why
        failed = json.loads((out / "failed.json").read_text())
        assert failed["error"] == f"killed: snakemake (pid {dag.pid}) is gone"
        assert run_status(work, failed["run_id"]) == "FAILED"


@pytest.mark.slow
def test_ctrl_c_stops_the_dag_within_seconds(tmp_path):
    """A terminal's Ctrl-C: SIGINT to snakemake's whole process group, its jobs included."""
    work = tmp_path / "work"
    dag = subprocess.Popen(
        ticker_workflow(work, seconds=600),
        env=clean_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        wait_for(lambda: (work / "results/ticker/main/started").exists(), "the job", 180)
        os.killpg(dag.pid, signal.SIGINT)
        t0 = time.time()
        dag.wait(timeout=120)
    finally:  # a DAG that outlived its Ctrl-C is not left ticking
        if dag.poll() is None:
            os.killpg(dag.pid, signal.SIGKILL)
    assert dag.returncode != 0 and time.time() - t0 < 30
    assert "ticker[main] failed: KeyboardInterrupt" in (work / "ticker.log").read_text()
    assert json.loads((work / "results/ticker/main/failed.json").read_text())["status"] == "failed"


def test_a_launched_process_dies_with_its_owner(tmp_path):
    """A sharding rank's lifeline (steps/lifeline.py OWNER_ENV, set by steps/sharding/processes.py)."""
    owner = subprocess.Popen(["sleep", "600"])
    code = "from steps.lifeline import die_with_owner; import time; die_with_owner(); time.sleep(600)"
    env = {**clean_env(), "N00BGPT_OWNER_PID": str(owner.pid)}
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    assert child.poll() is None, child.stderr.read()
    owner.kill()
    owner.wait()
    t0 = time.time()
    child.wait(timeout=30)
    assert time.time() - t0 < 5 and child.returncode == -signal.SIGTERM
    assert f"(pid {owner.pid}) is gone" in child.stderr.read()


def ranks_of(out: Path) -> list[str]:
    """Pids of torch ranks (named rank<r> by the worker, not their torchrun agent or forkserver)
    writing to `out`."""
    alive = []
    for pid in processes_naming(out):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().startswith("rank"):
                alive.append(pid)
    return alive


@pytest.mark.slow
def test_torch_ranks_die_with_a_killed_job(tmp_path):
    """The job that launched a torchrun cell is SIGKILLed (the OOM killer): its ranks, each in a
    session of its own, and torchrun's agent go too (before: they ran on, hung in a collective)."""
    out = tmp_path / "cell"
    plan = {
        "mlp": {"dim": 8, "hidden": 16, "layers": 2},
        "batch_size": 8,
        "steps": 3,
        "strategy": "dp",
        "mesh": {"dp": 2},
        "fault": {"kill_rank": 1, "at_step": 1, "mode": "hang"},  # rank 0 waits in a collective
        "launch": {"timeout_s": 600},
    }
    code = "from steps.sharding.plan import Plan; from steps.sharding.launch import launch; import json, sys; "
    code += "launch(Plan.from_params(json.loads(sys.argv[1])), __import__('pathlib').Path(sys.argv[2]))"
    job = subprocess.Popen([sys.executable, "-c", code, json.dumps(plan), str(out)], env=clean_env())
    try:
        wait_for(lambda: len(ranks_of(out)) == 2, "two ranks", 300)
        time.sleep(3)
    finally:
        job.kill()
        job.wait()
    assert wait_for(lambda: not ranks_of(out), "the ranks gone", 60) < 10
    wait_for(lambda: not processes_naming(out), "torchrun's agent gone (it follows its ranks)", 60)


# ---- a crafted checkpoint -------------------------------------------------------------------------
class WritesAFile:
    """What a crafted checkpoint holds: unpickling it calls open(path, "w"), creating the file."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_crafted_checkpoint_is_refused_and_its_code_does_not_run(tmp_path):
    marker, evil = tmp_path / "written-by-the-checkpoint", tmp_path / "ckpt.pt"
    torch.save({"model": WritesAFile(marker), "config": {}}, evil)

    # the real command, a fresh interpreter (not forked from this test's warm one)
    args = ["--checkpoint", str(evil), "--prompt", "hi"]
    proc = run_module(tmp_path, "steps.chat", args, timeout=300, fork=False)
    assert proc.returncode != 0 and not marker.exists()
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"{evil}: refused to load") and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "fix: delete it" in lines[-1], lines[-1]  # the file, what is wrong, and the fix: one line

    from steps.models.training import read_checkpoint

    with pytest.raises(InputError, match="refused to load"):
        read_checkpoint(evil)  # the resume path (steps/models/training.py)
    assert not marker.exists()
    with open(evil, "rb") as fh:  # the control: the file does run code when unpickled blindly
        torch.load(fh, weights_only=False)
    assert marker.exists()


def test_the_labs_own_checkpoint_loads_weights_only(tmp_path):
    from steps.models.gpt import GPTConfig, GPTLMHeadModel
    from steps.models.train_step import StepOptions, TrainStep
    from steps.models.training import TrainState, read_checkpoint, save_checkpoint

    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16)
    model = GPTLMHeadModel(cfg)
    ts = TrainStep(model, torch.device("cpu"), StepOptions())
    loss, gnorm = ts.step([torch.randint(0, 64, (2, 8))])
    state = TrainState(step=1, history=[{"step": 1, "train_loss": loss, "grad_norm": float(gnorm)}], tokens=16)
    extra = {"fingerprint": "f", "config": cfg.__dict__, "tokenizer": "tokenizer", "seed": 0}
    save_checkpoint(tmp_path / "ckpt.pt", model, ts.optimizer, state, extra)
    ck = read_checkpoint(tmp_path / "ckpt.pt")
    assert ck["state"] == state.__dict__ and GPTConfig(**ck["config"]) == cfg
    assert all(torch.equal(ck["model"][k], v) for k, v in model.state_dict().items())
