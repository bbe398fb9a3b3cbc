"""Running one launch's processes: their own session, tagged (steps/sharding/reap.py stops them for
good), owned by this job (steps/lifeline.py), killed as a group at the timeout; and, once every rank's
record is written, a bounded wait for them to exit (a teardown hang keeps the records)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from steps import lifeline
from steps.sharding.reap import kill_tagged, stop


class LaunchError(RuntimeError):
    """A rank died, hung past the timeout, or wrote no result."""


EXIT_GRACE_S = 30.0  # how long the processes may take to exit once every rank's record is written


def run_processes(
    cmd: list[str],
    out: Path,
    timeout_s: float,
    env_extra: dict | None = None,
    log_name: str = "processes.log",
    done=None,
) -> float:
    """Run `cmd` in its own session; on timeout kill the whole group. Returns wall seconds. `done()`
    (optional) says the work is complete (every rank's record written): from then on the processes get
    EXIT_GRACE_S to exit, and if they hang in teardown (gloo's, seen in CI: both records written, the
    launcher still waiting 180 s later) they are killed and the launch stands, with a line in the job's
    log; a hang before the records is a failed launch, as before."""
    out.mkdir(parents=True, exist_ok=True)
    for pattern in ("rank*.json", "hold.rank*", "peers.json"):
        for old in out.glob(pattern):
            old.unlink(missing_ok=True)
    tag = uuid.uuid4().hex  # marks every process of this launch, whatever its session
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "OMP_NUM_THREADS": "1",
        **(env_extra or {}),
        "N00BGPT_LAUNCH": tag,
        "N00BGPT_LAUNCH_OUT": str(out),  # in every process's environment, also a forked rank's (tests find them)
        lifeline.OWNER_ENV: str(os.getpid()),  # the ranks stop if this process dies (steps/lifeline.py)
    }
    log = out / log_name
    t0 = time.time()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = wait_or_done(proc, t0 + timeout_s, done)
        except subprocess.TimeoutExpired:
            stop(proc, tag)
            if done is not None and done():
                print(
                    f"launch: every rank's record was written, but the processes did not exit within "
                    f"{EXIT_GRACE_S:.0f} s (a teardown hang); killed the group, the records stand",
                    file=sys.stderr,
                    flush=True,
                )
                return time.time() - t0
            raise LaunchError(f"timed out after {timeout_s:.0f} s (a rank hung); killed the group; log {log}")
        except BaseException:  # the job is stopping (SIGTERM, Ctrl-C, its snakemake died): so do its ranks
            stop(proc, tag)
            raise
    if rc != 0:
        kill_tagged(tag)  # a surviving rank would wait in a collective until gloo's timeout
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise LaunchError(f"exit code {rc} after {time.time() - t0:.1f} s (a rank failed); log {log}:\n{tail}")
    return time.time() - t0


def wait_or_done(proc: subprocess.Popen, deadline: float, done=None) -> int:
    """proc's exit status, by `deadline`, or by EXIT_GRACE_S after `done()` first holds; else
    subprocess.TimeoutExpired."""
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            if time.time() >= deadline:
                raise
            if done is not None and deadline - time.time() > EXIT_GRACE_S and done():
                deadline = time.time() + EXIT_GRACE_S


def records_written(out: Path, world: int):
    """done() for run_processes: rank 0 has written every rank's record (after the last collective)."""
    return lambda: len(list(out.glob("rank*.json"))) >= world
