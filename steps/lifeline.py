"""A job dies with the `snakemake` that started it, and a job's own processes die with the job.

Snakemake runs a job as `bash -c 'set -euo pipefail; python -m steps.<stage> ... > log 2>&1'`: the
shell stays the job's parent (it does not exec the command), so when snakemake itself is killed
(the OOM killer, `kill -9`, a closed SSH session) nothing reaches the job, and a rerun after
`--unlock` would start a second writer of the same files. So the job:

- asks the kernel for SIGTERM when its parent (that shell) dies (prctl PR_SET_PDEATHSIG);
- finds the snakemake among its ancestors and watches it from a daemon thread (a pidfd, or polling
  /proc where the kernel has none): when it is gone, SIGTERM to the job, which ends its MLflow run
  FAILED and writes failed.json (steps/core/job.py), and SIGKILL GRACE_S later if it is still there.

A process the job starts (torchrun's ranks, the JAX process of a sharding cell) watches the job the
same way: the launcher names it in OWNER_ENV (steps/sharding/launch.py). On SLURM the executor's
cancel (scancel) stops a job. Linux only; elsewhere nothing is watched. Stdlib only: a rank
imports this without loading the stage machinery.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time

OWNER_ENV = "N00BGPT_OWNER_PID"  # the pid whose exit stops this process (set by a launcher)
GRACE_S = 60.0  # after SIGTERM, time to end the MLflow run before SIGKILL
_PR_SET_PDEATHSIG = 1
_ANCESTORS = 4  # snakemake -> bash -> python is 2; a wrapper or two more is fine


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


def die_with_snakemake() -> None:
    """A job's first call (steps/core/job.py): stop with the parent shell and with snakemake."""
    pid = snakemake_ancestor() if sys.platform.startswith("linux") else None
    if pid is not None:  # run by hand (`python -m steps.<stage>`, nohup) it outlives its shell as before
        _ask_parent_death_signal()
        die_with(pid, "snakemake")


def die_with_owner() -> None:
    """A launched process's first call: stop with the process named in OWNER_ENV, if any."""
    owner = os.environ.get(OWNER_ENV)
    if owner and sys.platform.startswith("linux"):
        die_with(int(owner), "the job that launched this process")
