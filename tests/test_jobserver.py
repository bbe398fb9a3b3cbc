"""The job server (steps/jobserver/): a job's real command, `python -m steps.<stage> ...`, handed to a
server started as the Snakefile starts it, gives what the same command gives in its own process: its
files, log lines and exit status; a bad job fails with the same line; the caller's death or SIGTERM
ends the forked job within seconds with its MLflow run FAILED; a job whose environment the server
cannot give runs on its own. Real processes only: the server, the commands, the MLflow store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steps import jobserver
from steps.tracking import store
from tests.conftest import clean_env, io_args, sigint_as_in_a_terminal, smoke_params, stage_paths

pytestmark = pytest.mark.slow

FORKED = "job server: forked from pid"


def start_server(tmp_path: Path, **popen) -> tuple[str, subprocess.Popen]:
    """A job server on a socket in tmp_path, in the tests' job environment, once it listens."""
    sock = tmp_path / "jobs.sock"
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - the server's, for as long as it runs
    cmd = [sys.executable, "-m", "steps.jobserver", str(sock)]
    proc = subprocess.Popen(cmd, env=clean_env(), stdout=log, stderr=log, **popen)
    why = jobserver.wait_listening(proc, str(sock), 180)
    assert why is None, f"the job server: {why}\n{(tmp_path / 'server.log').read_text()}"
    return str(sock), proc


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A job server (start_server), one for the module's tests, as one serves a whole DAG (each test's
    jobs run in folders of their own; a job killed or failed leaves it serving: tested below); yields
    its socket path."""
    sock, proc = start_server(tmp_path_factory.mktemp("jobserver"))
    yield sock
    proc.terminate()
    proc.wait(30)


def job(work: Path, stage: str, cell: str = "main", over: dict | None = None) -> list[str]:
    """The job's command as its rule writes it, with the smoke config's params (and `over`)."""
    params = {**smoke_params(stage, cell), **(over or {})}
    cfg = {
        "stage": stage,
        "cell": cell,
        "params": params,
        "common": {"seed": 1234, "device": "cpu", "threads": 1, "tracking": {"uri": None}},
    }
    inputs, outputs = stage_paths(stage, cell)
    return [sys.executable, "-m", f"steps.{stage}", *io_args(inputs, outputs), "--cfg", json.dumps(cfg)]


def run(work: Path, cmd: list[str], sock: str | None, **kw) -> subprocess.CompletedProcess:
    env = {**clean_env(), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env[jobserver.SOCKET_ENV] = sock or "off"
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600, **kw)


def test_a_forked_job_gives_what_its_own_process_gives(tmp_path, server):
    work = tmp_path / "work"
    work.mkdir()
    forked = run(work, job(work, "prepare_corpus"), server)
    assert forked.returncode == 0, forked.stderr[-3000:]
    assert FORKED in forked.stderr  # it ran in the server's child, not here
    record = json.loads((work / "results/prepare_corpus/main/metrics.json").read_text())
    assert record["status"] == "ok"
    run_id = record["run_id"]
    assert store.client(f"sqlite:///{work / 'results/mlflow.db'}").get_run(run_id).info.status == "FINISHED"

    # the same job in its own process (no server): the same metrics
    alone = tmp_path / "alone"
    alone.mkdir()
    own = run(alone, job(alone, "prepare_corpus"), None)
    assert own.returncode == 0 and FORKED not in own.stderr, own.stderr[-3000:]
    mine = json.loads((alone / "results/prepare_corpus/main/metrics.json").read_text())
    untimed = lambda m: {k: v for k, v in m.items() if not k.endswith("_s")}  # noqa: E731 - wall times differ
    assert untimed(mine["metrics"]) == untimed(record["metrics"]) and len(untimed(mine["metrics"])) > 3

    # a bad job: the same exit status and the same last line as in its own process
    bad = job(work, "prepare_corpus", over={"max_documents": "many"})
    a, b = run(work, bad, server), run(alone, bad, None)
    assert a.returncode == b.returncode != 0
    assert a.stderr.strip().splitlines()[-1] == b.stderr.strip().splitlines()[-1]


def test_the_job_ends_with_its_caller(tmp_path, server):
    """SIGTERM to the command (snakemake's Ctrl-C reaches it, not the server's child) is forwarded: the
    job fails with its line; SIGKILL of the command (its snakemake died) ends the forked job within 5 s,
    its run FAILED, without metrics.json."""
    work = tmp_path / "work"
    work.mkdir()
    assert run(work, job(work, "prepare_corpus"), server).returncode == 0
    long_job = job(work, "word2vec", "sgd", over={"epochs": 10_000})
    folder = work / "results/word2vec/sgd"
    for how in (signal.SIGTERM, signal.SIGKILL):
        env = {**clean_env(), jobserver.SOCKET_ENV: server}
        log = open(tmp_path / f"job-{how.name}.log", "w+")  # noqa: SIM115
        caller = subprocess.Popen(long_job, cwd=work, env=env, stdout=log, stderr=log)
        t0 = time.time()
        while "word2vec:" not in Path(log.name).read_text():
            assert caller.poll() is None and time.time() - t0 < 300, Path(log.name).read_text()[-3000:]
            time.sleep(0.2)
        child = int(Path(log.name).read_text().split(FORKED)[1].split("pid ")[1].split(")")[0])
        caller.send_signal(how)
        caller.wait(60)
        t1 = time.time()
        while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
            assert time.time() - t1 < 5, f"the forked job ran on {time.time() - t1:.1f} s after its caller's {how.name}"
            time.sleep(0.1)
        text = Path(log.name).read_text()
        assert caller.returncode != 0, text[-2000:]
        assert not (folder / "metrics.json").exists()
        failed = json.loads((folder / "failed.json").read_text())
        assert store.client(f"sqlite:///{work / 'results/mlflow.db'}").get_run(failed["run_id"]).info.status == "FAILED"
        if how == signal.SIGTERM:
            assert "killed by signal 15" in text
        else:
            assert "the job's command" in failed["error"]
        log.close()
        (folder / "failed.json").unlink()


def test_the_venv_s_python_and_python3_are_one_interpreter(tmp_path):
    """Snakemake's entry script runs the venv's `python3` (so does the job server it starts), a rule's
    command the venv's `python`: two names of one file, which fork (before: compared as strings, every job
    of a `snakemake` DAG ran in its own process, paying its imports)."""
    names = [p for p in (Path(sys.prefix) / "bin").glob("python*") if p.name != "python3-config"][:2]
    assert len(names) == 2 and names[0].resolve() == names[1].resolve(), names
    sock = tmp_path / "jobs.sock"
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - the server's, for as long as it runs
    proc = subprocess.Popen(
        [str(names[0]), "-m", "steps.jobserver", str(sock)], env=clean_env(), stdout=log, stderr=log
    )
    try:
        why = jobserver.wait_listening(proc, str(sock), 180)
        assert why is None, f"the job server: {why}\n{(tmp_path / 'server.log').read_text()}"
        work = tmp_path / "work"
        work.mkdir()
        forked = run(work, [str(names[1]), *job(work, "prepare_corpus")[1:]], str(sock))
        assert forked.returncode == 0 and FORKED in forked.stderr, forked.stderr[-3000:]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_job_the_server_cannot_give_its_environment_runs_on_its_own(tmp_path, server):
    work = tmp_path / "work"
    work.mkdir()
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: a job that sets it otherwise cannot fork
    other = "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1"
    env = {**clean_env(), jobserver.SOCKET_ENV: server, "HF_HUB_OFFLINE": other}
    proc = subprocess.run(job(work, "prepare_corpus"), cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert FORKED not in proc.stderr
    assert "its environment differs from the server's in HF_HUB_OFFLINE" in proc.stderr


def test_a_forked_job_killed_outright_fails_its_command_with_the_signal(tmp_path, server):
    """SIGKILL of the forked job itself (the OOM killer): no status from it; the caller asks the server,
    which reaped it, and exits 128 + 9 with one line."""
    work = tmp_path / "work"
    work.mkdir()
    assert run(work, job(work, "prepare_corpus"), server).returncode == 0
    env = {**clean_env(), jobserver.SOCKET_ENV: server}
    log = tmp_path / "job.log"
    with open(log, "w") as out:
        caller = subprocess.Popen(
            job(work, "word2vec", "sgd", over={"epochs": 10_000}), cwd=work, env=env, stdout=out, stderr=out
        )
        t0 = time.time()
        while "word2vec:" not in log.read_text():
            assert caller.poll() is None and time.time() - t0 < 300, log.read_text()[-3000:]
            time.sleep(0.2)
        child = int(log.read_text().split(FORKED)[1].split("pid ")[1].split(")")[0])
        os.kill(child, signal.SIGKILL)
        assert caller.wait(60) == 128 + signal.SIGKILL
    assert f"the forked job (pid {child}) was killed by signal 9" in log.read_text()


@pytest.mark.parametrize(
    "argv, handed",
    [
        (["python", "-m", "steps.word2vec", "--cfg", "{}"], "steps.word2vec"),
        (["python", "-m", "steps.perf", "--cfg", "{}"], None),  # measures its own process, re-executes itself
        (["python", "-m", "steps.core.runcache", "word2vec", "--cfg", "{}"], None),  # the run cache: light already
        (["python", "-m", "steps.word2vec", "--help"], None),
        (["python", "-c", "import steps"], None),
        (["python", "-m", "steps.tracking.lab", "start", "--command", "snakemake"], "steps.tracking.lab"),
        (["python", "-m", "steps.tracking.lab", "end", "--status", "FAILED"], "steps.tracking.lab"),
        (["python", "-m", "steps.tracking.lab", "--help"], None),
        (["python", "-m", "steps.tracking.views", "--cfg", "{}"], None),  # no stage, no lab run
    ],
)
def test_only_stage_jobs_are_handed_over(argv, handed):
    assert jobserver._stage_module(argv) == handed


def test_the_lab_run_opens_and_closes_in_the_server(tmp_path, server):
    """The Snakefile's `onstart`/`onsuccess` commands, forked: the config on stdin, the run id on stdout
    (pipes, as the Snakefile's subprocess gives them), the run FINISHED in the lab experiment; no line
    of the fork's in what the terminal shows."""
    work = tmp_path / "work"
    work.mkdir()
    lab = [sys.executable, "-m", "steps.tracking.lab"]
    config = json.dumps({"seed": 7, "tracking": {"uri": None}})
    start = run(work, [*lab, "start", "--command", "snakemake --cores 2"], server, input=config)
    assert start.returncode == 0 and FORKED not in start.stderr, start.stderr[-3000:]
    run_id = start.stdout.split()[-1]
    env = {**clean_env(), jobserver.SOCKET_ENV: server, "N00BGPT_LAB_RUN": run_id}
    end = subprocess.run(
        [*lab, "end", "--status", "FINISHED"], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert end.returncode == 0 and FORKED not in end.stderr and "FINISHED" in end.stderr + end.stdout, end.stderr[
        -3000:
    ]
    server_log = (Path(server).parent / "server.log").read_text()
    assert server_log.count("forked steps.tracking.lab") == 2, server_log[-3000:]
    c = store.client(f"sqlite:///{work / 'results/mlflow.db'}")
    r = c.get_run(run_id)
    assert (
        r.info.status == "FINISHED" and r.data.params["seed"] == "7" and r.data.tags["command"] == "snakemake --cores 2"
    )
    assert c.get_experiment(r.info.experiment_id).name == "n00bgpt/lab"


def hand_over(sock: str, cwd: str, env: dict) -> socket.socket:
    """A caller's request, as `delegate` sends it (its own stdin/stdout/stderr passed); returns the
    connection, on which the forked job's pid comes back, then (after the caller's "go") its exit status."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock)
    request = {"module": "steps.word2vec", "args": ["--cfg", "{}"], "cwd": cwd, "env": env, "umask": 0o22}
    ids = {"caller": os.getpid(), "executable": sys.executable, "interpreter": jobserver.interpreter()}
    data = json.dumps({**request, **ids}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(data)) + data], [0, 1, 2])
    return conn


def test_a_job_that_cannot_start_fails_alone_and_the_server_serves_on(tmp_path, server):
    """A forked job whose working folder is gone, or whose caller hung up before its pid came back,
    ends itself (before: its exception left `_child` into the server's loop in the forked process,
    which unlinked the server's socket on its way out: every later job of the DAG ran on its own)."""
    gone = tmp_path / "gone"
    conn = hand_over(server, str(gone), clean_env())
    pid = jobserver._recv(conn)["pid"]
    jobserver._send(conn, {"go": True})  # the caller waits for it: it may start
    assert jobserver._recv(conn) == {"exit": 1}
    assert jobserver._status_of(server, pid) == {"exit": 1, "from": "server"}
    hand_over(server, str(tmp_path), clean_env()).close()  # the caller is gone before the pid is sent
    time.sleep(2)
    assert Path(server).exists()
    work = tmp_path / "work"
    work.mkdir()
    forked = run(work, job(work, "prepare_corpus"), server)
    assert forked.returncode == 0 and FORKED in forked.stderr, forked.stderr[-3000:]


def started_long_job(work: Path, sock: str, log: Path, **popen) -> tuple[subprocess.Popen, int]:
    """A long word2vec job handed to the server at `sock`, once it trains: (its command, the forked pid)."""
    assert run(work, job(work, "prepare_corpus"), sock).returncode == 0
    env = {**clean_env(), jobserver.SOCKET_ENV: sock}
    out = open(log, "w")  # noqa: SIM115 - the job's log, as snakemake's redirection opens it
    caller = subprocess.Popen(
        job(work, "word2vec", "sgd", over={"epochs": 10_000}), cwd=work, env=env, stdout=out, stderr=out, **popen
    )
    t0 = time.time()
    while "word2vec:" not in log.read_text():
        assert caller.poll() is None and time.time() - t0 < 300, log.read_text()[-3000:]
        time.sleep(0.2)
    return caller, int(log.read_text().split(FORKED)[1].split("pid ")[1].split(")")[0])


def running(pid: int) -> bool:
    """`pid` exists and is no zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_reaches_a_forked_job_once(tmp_path):
    """A terminal's Ctrl-C: SIGINT to snakemake's whole process group, where the Snakefile starts the
    server, and the job's command, which forwards its own SIGINT to the forked job. The job gets one
    KeyboardInterrupt, as in its own process: its run ends FAILED, failed.json says why, no traceback
    (before: the group's SIGINT and the forwarded one both reached it, the second one cut short the
    ending of the first)."""
    sock, server = start_server(tmp_path, process_group=0, preexec_fn=sigint_as_in_a_terminal)
    try:
        work = tmp_path / "work"
        work.mkdir()
        log = tmp_path / "job.log"
        caller, child = started_long_job(work, sock, log, process_group=server.pid, preexec_fn=sigint_as_in_a_terminal)
        time.sleep(1)
        os.killpg(server.pid, signal.SIGINT)
        t0 = time.time()
        caller.wait(60)
        print(f"the forked job's command ended {time.time() - t0:.1f} s after Ctrl-C")
        text = log.read_text()
        assert caller.returncode != 0 and not running(child), text[-3000:]
        failed = json.loads((work / "results/word2vec/sgd/failed.json").read_text())
        assert failed["error"].startswith("KeyboardInterrupt"), text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert store.client(f"sqlite:///{work / 'results/mlflow.db'}").get_run(failed["run_id"]).info.status == "FAILED"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


def test_a_server_that_does_not_answer_leaves_the_job_to_its_own_process(tmp_path):
    """A server stopped or stuck after the kernel accepted the connection: the job runs in its own
    process after HAND_OVER_S (before: it waited for the server's answer for ever)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "stuck.sock"))
    sock.listen(8)  # never accepted: connect succeeds, no answer comes
    work = tmp_path / "work"
    work.mkdir()
    env = {**clean_env(), jobserver.SOCKET_ENV: str(tmp_path / "stuck.sock"), jobserver.WAIT_ENV: "2"}
    log = tmp_path / "job.log"  # a file, as the rule's log: the unanswered request holds the job's descriptors
    try:
        with open(log, "w") as out:
            own = subprocess.run(job(work, "prepare_corpus"), cwd=work, env=env, stdout=out, stderr=out, timeout=600)
    finally:
        sock.close()
    assert own.returncode == 0, log.read_text()[-3000:]
    assert "job server: no answer within 2 s; running this job in its own process" in log.read_text()
    assert json.loads((work / "results/prepare_corpus/main/metrics.json").read_text())["status"] == "ok"


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_ctrl_z_stops_a_forked_job_and_fg_resumes_it(tmp_path):
    """A terminal's Ctrl-Z (SIGTSTP to snakemake's group) stops the forked job with its caller, and
    `fg` (SIGCONT to the group) resumes both (before: the job, in a group of its own, ran on)."""
    sock, server = start_server(tmp_path, process_group=0)
    try:
        work = tmp_path / "work"
        work.mkdir()
        caller, child = started_long_job(work, sock, tmp_path / "job.log", process_group=server.pid)
        os.killpg(server.pid, signal.SIGTSTP)
        t0 = time.time()
        while state(child) != "T":
            assert time.time() - t0 < 10, f"the forked job is {state(child)} 10 s after Ctrl-Z"
            time.sleep(0.1)
        assert state(caller.pid) == "T"
        os.killpg(server.pid, signal.SIGCONT)
        t0 = time.time()
        while state(child) == "T":
            assert time.time() - t0 < 10, "the forked job is still stopped 10 s after SIGCONT"
            time.sleep(0.1)
        caller.terminate()
        assert caller.wait(60) != 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
