"""A job dies with the `snakemake` that started it, and a job's own processes die with the job.

Snakemake runs a job as `bash -c 'set -euo pipefail; python -m steps.<stage> ... > log 2>&1'`: the
shell stays the job's parent (it does not exec the command), so when snakemake itself is killed
(the OOM killer, `kill -9`, a closed SSH session) nothing reaches the job, and a rerun after
`--unlock` would start a second writer of the same files. So the job:

- watches the snakemake among its ancestors from a daemon thread (a pidfd, or polling /proc where the
  kernel has none), armed as `steps` is imported (steps/__init__.py), before the stage's own imports
  (torch, transformers: ~15 s on a loaded 2-core host, in which the job's shell is orphaned and the
  snakemake above it could no longer be found);
- asks the kernel for SIGTERM when its parent (that shell) dies (prctl PR_SET_PDEATHSIG);
- when snakemake is gone, stops within seconds without waiting for its own code (a training step in
  C handles no signal until it returns): the thread holds `finishing` for good, so no metrics.json
  follows, runs the job's ending (`on_death`: its MLflow run ends FAILED, failed.json says why;
  steps/core/job.py) for at most END_S, ends its shell (which would run what follows the job in its
  line: `runcache || job`, workflow/rules/common.smk) and the process (os._exit). A job that had not yet
  registered an ending (it was still importing) has no run to end and exits at once; an ending cut
  short at END_S leaves the run RUNNING, and the next invocation of the job closes it FAILED
  (steps/tracking/mlflow_run.py).

A process the job starts (torchrun's ranks, the JAX process of a sharding cell) watches the job:
the launcher names it in OWNER_ENV (steps/sharding/processes.py); when the job is gone it gets SIGTERM,
and SIGKILL GRACE_S later. On SLURM the executor's cancel (scancel) stops a job. Linux only;
elsewhere nothing is watched. Stdlib only: a rank imports this without loading the stage machinery.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from typing import Callable

OWNER_ENV = "N00BGPT_OWNER_PID"  # the pid whose exit stops this process (set by a launcher)
GRACE_S = 60.0  # a launched process: after SIGTERM, time to stop before SIGKILL
END_S = 3.0  # a job: once snakemake is gone, time its ending gets (run FAILED, failed.json) before it exits
_PR_SET_PDEATHSIG = 1
_ANCESTORS = 4  # snakemake -> bash -> python is 2; a wrapper or two more is fine

_watching = 0  # the pid of the process whose snakemake is watched (a forked child has no watcher)
_endings: list[Callable[[str], None]] = []  # what the job runs when snakemake is gone (on_death)
_finish = threading.Lock()  # the job's last writes (`finishing`); held for good once snakemake is gone
_finished = False  # the job wrote its results before snakemake went: nothing left to stop
_shell: tuple[int, str] | None = None  # (pid, start time) of the job's shell, the parent between it and snakemake


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of `pid` from /proc, None when it is gone or a zombie."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else (int(fields[1]), fields[19])


def _argv(pid: int) -> list[str]:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
    except OSError:
        return []


def is_snakemake(argv: list[str]) -> bool:
    """`python -m snakemake ...`, or the `snakemake` script (argv[0], or argv[1] after its python)."""
    if len(argv) > 2 and argv[1] == "-m":
        return argv[2] == "snakemake"
    return any(os.path.basename(a) == "snakemake" for a in argv[:2])


def snakemake_ancestor() -> int | None:
    """The pid of the snakemake process this one runs under, None when there is none."""
    pid = os.getpid()
    for _ in range(_ANCESTORS):
        st = _stat(pid)
        if st is None or st[0] <= 1:
            return None
        pid = st[0]
        if is_snakemake(_argv(pid)):
            return pid
    return None


def _ask_parent_death_signal() -> None:
    """SIGTERM from the kernel when the parent exits (best effort: Linux, glibc)."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request: the kernel will not send it now
        os.kill(os.getpid(), signal.SIGTERM)


def _wait_gone(pid: int) -> None:
    """Block until `pid` exits: a pidfd turns readable at its exit; else poll /proc twice a second."""
    start = _stat(pid)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # Python or kernel without pidfd
        while start is not None and _stat(pid) == start:
            time.sleep(0.5)
        return
    select.select([fd], [], [])
    os.close(fd)


def _watch(pid: int, what: str) -> None:
    _wait_gone(pid)
    print(f"{what} (pid {pid}) is gone: stopping this process (pid {os.getpid()})", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)


def die_with(pid: int, what: str) -> None:
    """SIGTERM this process when `pid` exits, then SIGKILL GRACE_S later (a daemon thread)."""
    threading.Thread(target=_watch, args=(pid, what), name="lifeline", daemon=True).start()


def on_death(ending: Callable[[str], None]) -> None:
    """Run `ending(why)` from the lifeline's thread once snakemake is gone, before the job exits (at
    most END_S for all of them): the job's main thread may be deep in a step, and is not waited for."""
    _endings.append(ending)


@contextlib.contextmanager
def finishing():
    """Hold while the job writes its results (metrics.json): once snakemake is gone the lifeline holds
    this until the process exits, so a killed job never writes them; results written before that
    leave it nothing to stop."""
    global _finished
    with _finish:
        yield
        _finished = True


def _run_endings(why: str) -> None:
    for ending in list(_endings):
        try:
            ending(why)
        except BaseException as exc:  # noqa: BLE001 - the process exits next whatever an ending raised
            print(f"ending after {why}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _end_job(pid: int, what: str) -> None:
    """A job's watch: when snakemake is gone, end the job from here and exit, within END_S."""
    _wait_gone(pid)
    _finish.acquire()  # never released: the process exits below
    if _finished:
        _finish.release()  # the job wrote its results just before: it is ending on its own
        return
    why = f"{what} (pid {pid}) is gone"
    print(f"{why}: ending this job (pid {os.getpid()}) without waiting for its step", file=sys.stderr, flush=True)
    if _endings:
        ending = threading.Thread(target=_run_endings, args=(why,), name="lifeline-ending", daemon=True)
        ending.start()
        ending.join(END_S)
        if ending.is_alive():
            print(
                f"its ending took over {END_S:g} s: its MLflow run may stay RUNNING until the next invocation of "
                "this job closes it FAILED",
                file=sys.stderr,
                flush=True,
            )
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    _end_shell()
    os._exit(1)


def _end_shell() -> None:
    """SIGKILL the job's own shell (the one recorded when the watch began, if it is still that process),
    so it runs nothing after the job; the parent-death signal is withdrawn first (the job ends itself)."""
    if _shell is None or _stat(_shell[0]) is None or _stat(_shell[0])[1] != _shell[1]:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, 0)
    with contextlib.suppress(OSError):
        os.kill(_shell[0], signal.SIGKILL)


def die_with_snakemake() -> None:
    """Stop with the parent shell and with snakemake: called as `steps` is imported (steps/__init__.py)
    and again by a job's runner (steps/core/job.py), which then registers its ending (on_death); the
    second call finds the watch in place. A process run by hand (`python -m steps.<stage>`, nohup)
    has no snakemake above it and outlives its shell as before."""
    global _watching, _shell
    if _watching == os.getpid() or not sys.platform.startswith("linux"):
        return
    if is_snakemake(sys.orig_argv if hasattr(sys, "orig_argv") else sys.argv):
        return  # snakemake itself (its Snakefile imports steps), or one it runs in a subprocess
    pid = snakemake_ancestor()
    if pid is not None:
        _watching = os.getpid()
        parent = os.getppid()
        shell = _stat(parent) if parent != pid else None  # the job's own shell: its parent is snakemake
        _shell = (parent, shell[1]) if shell and shell[0] == pid else None
        _ask_parent_death_signal()
        threading.Thread(target=_end_job, args=(pid, "snakemake"), name="lifeline", daemon=True).start()


def die_with_caller(pid: int) -> None:
    """A job forked by the job server (steps/jobserver.py): it ends as a job ends when snakemake dies,
    when `pid` exits: the `python -m steps.<stage>` that handed it over, whose own lifeline watches
    snakemake (and which snakemake's Ctrl-C or kill reaches). The server above it is no job's shell."""
    global _watching, _shell
    _watching, _shell = os.getpid(), None
    threading.Thread(target=_end_job, args=(pid, "the job's command"), name="lifeline", daemon=True).start()


def die_with_owner() -> None:
    """A launched process's first call: stop with the process named in OWNER_ENV, if any."""
    owner = os.environ.get(OWNER_ENV)
    if owner and sys.platform.startswith("linux"):
        die_with(int(owner), "the job that launched this process")
