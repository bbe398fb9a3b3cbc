"""Start a cell's processes and fail fast: torchrun for torch cells, a subprocess with N host
devices for JAX cells. The parent (the Snakemake job that owns the cell's single MLflow run)
waits with a timeout and reads one JSON per rank; a rank that dies makes torchrun tear the group
down (max_restarts 0), a rank that hangs is killed with its whole process group at the timeout.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from steps.parallel.plan import Plan


class LaunchError(RuntimeError):
    """A rank died, hung past the timeout, or wrote no result."""


def torchrun_cmd(plan: Plan, out: Path) -> list[str]:
    ln = plan.launch
    nnodes = int(ln.get("nnodes", 1))
    if plan.world % nnodes:
        raise LaunchError(f"world {plan.world} (mesh {plan.mesh}) does not split over nnodes={nnodes}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--max_restarts", "0",
           "--nproc_per_node", str(plan.world // nnodes)]
    if nnodes == 1 and not ln.get("rdzv_endpoint"):
        cmd.append("--standalone")
    else:  # multi-node: every node runs the same job with its node_rank and the shared endpoint
        cmd += ["--nnodes", str(nnodes), "--node_rank", str(ln.get("node_rank", 0)),
                "--rdzv_backend", "c10d", "--rdzv_endpoint", ln["rdzv_endpoint"],
                "--rdzv_id", str(ln.get("rdzv_id", "sharding"))]
    return cmd + ["-m", "steps.parallel.worker", "--plan", json.dumps(plan.to_dict()), "--out", str(out)]


def jax_cmd(plan: Plan, out: Path) -> list[str]:
    return [sys.executable, "-m", "steps.parallel.jax_mlp", "--plan", json.dumps(plan.to_dict()), "--out", str(out)]


def run_processes(cmd: list[str], out: Path, timeout_s: float, env_extra: dict | None = None) -> float:
    """Run `cmd` in its own session; on timeout kill the whole group. Returns wall seconds."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    tag = uuid.uuid4().hex  # marks every process of this launch, whatever its session
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1", **(env_extra or {}),
           "N00BGPT_LAUNCH": tag}
    log = out / "processes.log"
    t0 = time.time()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kill_tagged(tag)
            raise LaunchError(f"timed out after {timeout_s:.0f} s (a rank hung); killed the group; log {log}")
    if rc != 0:
        kill_tagged(tag)  # a surviving rank would wait in a collective until gloo's timeout
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise LaunchError(f"exit code {rc} after {time.time() - t0:.1f} s (a rank failed); log {log}:\n{tail}")
    return time.time() - t0


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


def collect(out: Path, world: int) -> list[dict]:
    ranks = sorted(out.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    if len(ranks) != world:
        raise LaunchError(f"expected {world} rank results in {out}, found {len(ranks)}")
    return [json.loads(p.read_text()) for p in ranks]


def launch(plan: Plan, out: Path) -> list[dict]:
    """Run the cell and return every rank's record (rank 0 first)."""
    timeout = float(plan.launch.get("timeout_s", 120))
    if plan.backend.startswith("jax"):
        flags = f"--xla_force_host_platform_device_count={max(plan.world, 1)}"
        run_processes(jax_cmd(plan, out), out, timeout, {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"})
        return collect(out, 1)
    run_processes(torchrun_cmd(plan, out), out, timeout)
    return collect(out, plan.world)
