"""The job server: the DAG's jobs forked from one warm process instead of each starting Python anew.

A job that only opens its MLflow run, logs and closes spends most of its CPU importing (MLflow with
its SQLAlchemy store, torch, pandas: 4-5 CPU-s of a 5 CPU-s no-op job on a 2-core EPYC; docs/pipeline.md
"The fixed cost of a job"). So, on a local run, the Snakefile starts this server when the DAG starts
(`onstart`) and stops it at the end; it imports PRELOAD once and listens on a Unix socket named in
SOCKET_ENV. Each job's command stays the same, `python -m steps.<stage> ...`: importing `steps` (before
the stage's own imports, steps/__init__.py) calls `delegate()`, which hands the job to the server when
one answers, and runs it in its own process as before when none does (no server, another environment,
a cluster job, any error of the hand-over).

The same job, forked:
- arguments, working folder, environment (the whole of the caller's; a job whose environment differs
  from the server's in a variable a library reads at import runs on its own: `blocking`), umask, and
  stdin/stdout/stderr (the caller's own file descriptors, passed over the socket: its log file);
- the exit status: the forked job sends it back and the caller exits with it; a forked job killed
  without one (SIGKILL, OOM) is a failed job (exit 1, one line in the log);
- signals: the caller forwards SIGTERM/SIGINT/SIGHUP to the forked job, which runs in a process group
  of its own, so a signal to the caller's group (a terminal's Ctrl-C) reaches it once, as it reaches a
  job in its own process; the job starts only once its caller said it waits for it (a caller that gave
  up on a server that does not answer, HAND_OVER_S, or died meanwhile, leaves nothing running);
- the lifeline (steps/lifeline.py): the forked job watches its caller, whose own lifeline watches
  snakemake: when snakemake (or the caller) dies, the job ends its MLflow run FAILED and exits within
  seconds, as a job in its own process does.

Off on a cluster (the Snakefile starts no server unless jobs run on this host: `workflow.local_exec`),
and with `N00BGPT_JOBSERVER=off` (or an empty SOCKET_ENV). Linux only. Stdlib only at module level:
every job imports this before anything else.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time

SOCKET_ENV = "N00BGPT_JOBSERVER"  # the server's socket path (set by the Snakefile for local runs)
WAIT_ENV = "N00BGPT_JOBSERVER_WAIT_S"  # HAND_OVER_S, where a test needs it shorter
# Imported by the server before it forks: what nearly every job imports, the MLflow store included.
PRELOAD = (
    "numpy",
    "pandas",
    "torch",
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "datasets",  # the data, tokenizer and fine-tuning stages (huggingface_hub reads its variables here)
    "transformers",
    "steps.core.job",
    "steps.core.stage",
)
# Read when a run starts or a request is sent (steps/tracking/mlflow_run.py, MLflow's system metrics
# monitor and rest_utils), by argparse's help (COLUMNS), by the shell, or by nothing a stage runs
# (pytest's), never when a library is imported: a job may differ from the server in these and still
# fork (tests/forked_stage.py, the tests' fork server, uses the same set).
RUN_TIME = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "N00BGPT_LAB_RUN",
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES",  # these three: steps.tracking.store.http_defaults
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
        "MLFLOW_HTTP_REQUEST_TIMEOUT",
        "_MLFLOW_TELEMETRY_SESSION_ID",  # set and unset as MLflow's telemetry client comes and goes
        "DISABLE_MLFLOW_INTEGRATION",  # steps/mcq/train.py; transformers reads it as a Trainer starts
        # set by threadpoolctl (and sklearn) when imported, read by Intel's OpenMP runtime only as a
        # second copy of it loads: the preloaded libraries have loaded theirs, either way
        "KMP_DUPLICATE_LIB_OK",
        "COLUMNS",
        "OLDPWD",
        "PWD",
        "SHLVL",
        "_",
        "PS1",
        SOCKET_ENV,
        WAIT_ENV,
        # the temporary folder: read by `tempfile` when first asked, which the forked job resets
        "TMPDIR",
        "TEMP",
        "TMP",
        "TEMPDIR",
    }
)
# Snakemake sets these to each job's `threads`; the libraries loaded in the server read them at load,
# so the forked job applies its own count instead (`apply_threads`): torch's, OpenMP's and BLAS's pools.
THREAD_VARS = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "GOTO_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    }
)
# The lab run's opening and closing (steps/tracking/lab.py), which the Snakefile runs once the server
# listens and before it stops: MLflow's client and store imported twice an invocation, ~3.5 CPU-s each.
LAB_MODULE = "steps.tracking.lab"
# Jobs that must start a process of their own: they measure it (the perf stage reads its peak RSS,
# which inherited pages would count) or re-execute themselves (perf sets glibc's MALLOC_MMAP_THRESHOLD_).
OWN_PROCESS = frozenset({"perf"})  # stage names: a module name here would enter every stage's code hash
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# A server that accepts but does not answer (stopped, stuck) within this gets no job: it runs here. The
# forked job starts only on the caller's word that it waits for it, so a late fork runs nothing twice.
HAND_OVER_S = float(os.environ.get(WAIT_ENV) or 60)


def wait_listening(proc, path: str, timeout: float) -> str | None:
    """Wait for a server started as `proc` to listen on `path` (it binds the socket once its imports are
    done): None once it does, else why it does not (it exited, or `timeout` seconds went by)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            return f"exited ({proc.returncode})"
        if time.monotonic() > deadline:
            return f"not listening after {timeout:g} s"
        time.sleep(0.05)
    return None


def blocking(env: dict, server_env: dict) -> list[str]:
    """The variables that keep a job in `env` from forking under a server started in `server_env`."""
    a = {k: v for k, v in env.items() if k not in RUN_TIME | THREAD_VARS}
    b = {k: v for k, v in server_env.items() if k not in RUN_TIME | THREAD_VARS}
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def threads_of(env: dict) -> int | None:
    """The thread count the job's environment asks for (Snakemake's `threads`), None if it names none
    or they disagree."""
    counts = {env[k] for k in THREAD_VARS if k in env}
    if len(counts) != 1:
        return None
    try:
        return max(1, int(counts.pop()))
    except ValueError:
        return None


def _send(conn: socket.socket, obj: dict) -> None:
    data = json.dumps(obj).encode()
    conn.sendall(struct.pack("!I", len(data)) + data)


def _recv(conn: socket.socket, head: bytes = b"") -> dict | None:
    """One framed message (a 4-byte length, then that much JSON); `head`: its first bytes, if read."""
    rest = _recv_exact(conn, 4 - len(head))
    if rest is None:
        return None
    head += rest
    body = _recv_exact(conn, struct.unpack("!I", head)[0])
    return None if body is None else json.loads(body)


def interpreter() -> list[str]:
    """What makes two processes the same Python: the binary (links resolved: a venv's `python` and
    `python3` are one file) and its prefix (the venv: another venv of the same binary has other
    packages) and version. Snakemake's entry script runs `python3`, a rule's command `python`."""
    return [os.path.realpath(sys.executable), sys.prefix, sys.version]


def recv_request(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """A caller's request and the file descriptors sent with its first bytes (`delegate`'s send_fds)."""
    first, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    return (_recv(conn, first) if first else None), fds


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        try:
            chunk = conn.recv(n - len(buf))
        except InterruptedError:
            continue
        if not chunk:
            return None
        buf += chunk
    return buf


# ---- the caller: `python -m steps.<stage>` -------------------------------------------------------


def _stage_module(argv: list[str]) -> str | None:
    """`steps.<stage>` when this process is `python -m steps.<stage> ...` for a job (or the lab run's
    start or end, LAB_MODULE), else None."""
    if len(argv) < 3 or argv[1] != "-m" or not argv[2].startswith("steps."):
        return None
    module = argv[2]
    if module == LAB_MODULE and argv[3:4] in (["start"], ["end"]):
        return module
    own = module.removeprefix("steps.") in OWN_PROCESS
    if own or module.startswith(("steps.core.", "steps.tracking.", "steps.jobserver")):
        return None
    if "--cfg" not in argv[3:]:
        return None  # the run cache, the lab run, the server itself, a --help: not a stage job
    return module


def delegate() -> None:
    """Run this job in the server and exit with its status, when a server answers; else return (the job
    runs here, as it always did)."""
    path = os.environ.get(SOCKET_ENV, "")
    argv = list(getattr(sys, "orig_argv", []))
    module = _stage_module(argv)
    if not path or path == "off" or module is None or not sys.platform.startswith("linux"):
        return
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(HAND_OVER_S)
        conn.connect(path)
        umask = os.umask(0)
        os.umask(umask)
        request = {
            "module": module,
            "args": argv[3:],
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "umask": umask,
            "caller": os.getpid(),
            "executable": sys.executable,
            "interpreter": interpreter(),
        }
        data = json.dumps(request).encode()
        socket.send_fds(conn, [struct.pack("!I", len(data)) + data], [0, 1, 2])
        answer = _recv(conn)
    except TimeoutError:
        conn.close()  # the forked job, if it comes, finds no caller to start for and ends
        print(f"job server: no answer within {HAND_OVER_S:g} s; running this job in its own process", file=sys.stderr)
        return
    except (OSError, ValueError):
        return  # no server (gone, never started): run here
    if not answer or "pid" not in answer:
        conn.close()
        if answer and answer.get("why"):
            print(f"job server: {answer['why']}; running this job in its own process", file=sys.stderr, flush=True)
        return
    child = answer["pid"]

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    def pause(signum, frame):  # Ctrl-Z: the forked job, in a group of its own, stops and goes on with this one
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here until SIGCONT (`fg`, `bg`)
        signal.signal(signal.SIGTSTP, pause)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGTSTP, pause)
    conn.settimeout(None)  # the job takes as long as it takes
    with contextlib.suppress(OSError):
        _send(conn, {"go": True})  # this process waits for it now: it may start (it ends if this one is gone)
    end = _recv(conn) or _status_of(path, child)
    if end is None:
        print(f"job server: no exit status for the forked job (pid {child}): the server is gone", file=sys.stderr)
        os._exit(1)
    code = int(end["exit"])
    if code > 128 and "from" in end:
        print(f"job server: the forked job (pid {child}) was killed by signal {code - 128}", file=sys.stderr)
    os._exit(code)


def _status_of(path: str, pid: int) -> dict | None:
    """The forked job's exit status from the server, which reaps it: for a job that lost its line to
    this process (it exec'd itself, or died without a word), waiting until it ends."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        _send(conn, {"status_of": pid})
        answer = _recv(conn)
    except OSError:
        return None
    return None if answer is None or "exit" not in answer else {**answer, "from": "server"}


def run_as_main(module: str) -> int:
    """`python -m <module>` in this process (sys.argv set by the caller), then Python's exit handlers:
    the exit status it would end with. Used by the forked job (steps/jobserver/__main__.py) and the
    tests' forked stages (tests/forked_stage.py)."""
    import runpy
    import traceback

    code: int | str | None = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - what python -m would print, then exit 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    return int(code or 0)
