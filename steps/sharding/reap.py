"""Stopping a launch for good: its process group and every rank it tagged (`N00BGPT_LAUNCH` in their
environment). torchrun starts each rank in a session of its own, so a group kill alone leaves ranks
behind, hung in a collective until gloo's timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def stop(proc: subprocess.Popen, tag: str) -> None:
    """SIGKILL the launch: its process group (torchrun, its agent) and every rank it tagged."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kill_tagged(tag)


def kill_tagged(tag: str) -> None:
    """SIGKILL every process launched with this tag: torchrun starts each rank in a session of its
    own, so killing torchrun's group leaves ranks orphaned (hung in a collective)."""
    needle = f"N00BGPT_LAUNCH={tag}".encode()
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (proc_dir / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc_dir.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # gone already, or not ours to read
