"""Start a cell's processes and fail fast: torchrun for torch cells, one subprocess for JAX cells.
The parent (the Snakemake job that owns the cell's single MLflow run) waits with a timeout and
reads one JSON per rank; a rank that dies makes torchrun tear the group down (max_restarts 0), a
rank that hangs is killed with its whole process group at the timeout.

Where a cell runs (decided here, before anything starts, from `device` and the GPUs this node has):
  device cpu   torch: gloo on the CPU; JAX: N host devices (XLA_FLAGS
               --xla_force_host_platform_device_count=N, JAX_PLATFORMS=cpu)
  device cuda  torch: NCCL, one GPU per local rank (NCCL refuses two ranks on one GPU); JAX: the
               first N GPUs (JAX_PLATFORMS=cuda; needs a jax with a CUDA plugin, `jax[cuda12]`).
               Fewer GPUs than the mesh needs -> NotEnoughGPUs ("needs N GPUs, found M"), which
               the stage records as a skipped cell: never a crash or a hang.
  device auto  as cuda when the cell fits on this node's GPUs, else as cpu (the fallback to CPU
               host devices / gloo is asked for by choosing auto). launch.dist_backend: nccl is
               GPU-only either way.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from importlib import util
from pathlib import Path

from steps.sharding import engines, nodes
from steps.sharding.plan import Plan
from steps.sharding.processes import LaunchError, records_written, run_processes


class NotEnoughGPUs(RuntimeError):
    """The cell needs more GPUs than this node has (the stage turns it into a skipped cell)."""


def jax_cell(plan: Plan) -> bool:
    """Whether the cell runs as one JAX process holding every device (else torchrun, a process per rank)."""
    return engines.process(plan.backend) == engines.JAX


def gpus_needed(plan: Plan) -> int:
    """GPUs this node needs to run the cell on CUDA: one per local torch rank (world / nnodes),
    one per JAX mesh device (JAX cells run in one process on one node)."""
    if jax_cell(plan):
        return max(plan.world, 1)
    return max(plan.world // max(plan.launch.nnodes, 1), 1)


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def cuda_gpus() -> int:
    """NVIDIA GPUs visible to this process (torch's count, also the proxy for JAX's). Imports
    torch, so the stage calls it only when a GPU is possible (a CPU cell's job stays torch-free)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def jax_has_cuda() -> bool:
    """Whether the installed jax can drive an NVIDIA GPU, without importing jax (which would
    initialise its backends in the parent): `jax[cuda12]`/`jax[cuda13]` install the kernels module
    jax_cudaNN_plugin and the PJRT plugin jax_plugins.xla_cudaNN."""
    for name in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"):
        try:
            if util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            pass
    return False


def torch_backend(plan: Plan, device: str, n_gpus: int) -> str:
    """The process-group backend of a torch cell: "nccl" (one GPU per local rank) or "gloo" (CPU).
    Raises NotEnoughGPUs when the cell must run on GPUs (device cuda, or dist_backend nccl) and
    this node has fewer than it has local ranks."""
    need, asked = gpus_needed(plan), plan.launch.dist_backend
    if device == "cpu" and asked != "nccl":
        return "gloo"
    if n_gpus >= need:
        return "nccl" if device in ("cuda", "auto") else asked
    if device == "auto" and asked != "nccl":
        return "gloo"  # auto: a cell that does not fit on the GPUs runs on the CPU
    why = "launch.dist_backend nccl" if asked == "nccl" and device != "cuda" else "device cuda"
    fix = "launch.dist_backend gloo and device auto run" if asked == "nccl" else "device auto runs"
    raise NotEnoughGPUs(
        f"skipped: needs {_gpus(need)}, found {n_gpus} ({why}: one GPU per rank of mesh "
        f"{plan.mesh_str}, NCCL runs no two ranks on one GPU; {fix} it on the CPU)"
    )


def jax_env(plan: Plan, device: str, n_gpus: int, jax_cuda: bool) -> dict:
    """Environment of a JAX cell's process: N CPU host devices, or the GPUs (see the module doc).
    Raises NotEnoughGPUs under device cuda when JAX cannot have N GPUs here."""
    need = gpus_needed(plan)
    if device in ("cuda", "auto") and jax_cuda and n_gpus >= need:
        # the first N GPUs form the mesh (jax.make_mesh); no preallocation of 75 % of every GPU
        return {"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if device == "cuda":
        found = n_gpus if jax_cuda else 0
        hint = (
            ""
            if jax_cuda
            else (f'; torch sees {n_gpus}, but the installed jax has no CUDA plugin (pip install "jax[cuda12]")')
        )
        raise NotEnoughGPUs(
            f"skipped: needs {_gpus(need)}, found {found} (JAX mesh {plan.mesh_str}{hint}; "
            "device auto runs it on CPU host devices)"
        )
    return {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={need}"}


def forked_ranks(plan: Plan) -> bool:
    """Whether the ranks fork from a preloaded forkserver (torchrun.py) rather than each exec'ing a
    fresh interpreter: launch.start_method, where auto means forked under gloo (CPU ranks share the
    cores, and 4-5 s of imports a rank is most of a small cell) and exec'd under NCCL."""
    method = plan.launch.start_method
    return method == "forkserver" or (method == "auto" and plan.launch.dist_backend == "gloo")


def torchrun_cmd(plan: Plan, out: Path) -> list[str]:
    ln = plan.launch
    nnodes = ln.nnodes
    if plan.world % nnodes:
        raise LaunchError(f"world {plan.world} (mesh {plan.mesh}) does not split over nnodes={nnodes}")
    if forked_ranks(plan):
        engine = engines.entry(plan.backend, plan.strategy).module
        cmd = [sys.executable, "-m", "steps.sharding.torchrun", "--preload", f"steps.sharding.worker,{engine}"]
        cmd += ["--start-method", "forkserver", "--run-path"]
        rank = [str(Path(__file__).with_name("worker.py"))]
    else:
        cmd, rank = [sys.executable, "-m", "torch.distributed.run"], ["-m", "steps.sharding.worker"]
    cmd += ["--max_restarts", "0", "--nproc_per_node", str(plan.world // nnodes)]
    if nnodes == 1 and not ln.rdzv_endpoint:
        cmd.append("--standalone")
    else:  # multi-node: every node runs the same job with its node_rank and the shared endpoint
        cmd += nodes.torchrun_args(ln)
    return cmd + rank + ["--plan", json.dumps(plan.to_dict()), "--out", str(out)]


def jax_cmd(plan: Plan, out: Path) -> list[str]:
    return [sys.executable, "-m", "steps.sharding.jax", "--plan", json.dumps(plan.to_dict()), "--out", str(out)]


def collect(out: Path, world: int) -> list[dict]:
    ranks = sorted(out.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
    if len(ranks) != world:
        raise LaunchError(f"expected {world} rank results in {out}, found {len(ranks)}")
    return [json.loads(p.read_text()) for p in ranks]


def launch(plan: Plan, out: Path, env: dict | None = None) -> list[dict]:
    """Run the cell and return every rank's record (rank 0 first). Torch cells run on the plan's
    launch.dist_backend; JAX cells in `env` (jax_env; default: CPU host devices). A (backend,
    strategy) without an engine fails here, before any process starts (engines.entry).
    Across nodes (nodes.py: the config or SLURM's environment) this runs this node's share; node 0
    returns every rank's record, another node [] once its ranks are done."""
    timeout = float(plan.launch.timeout_s)
    engines.entry(plan.backend, plan.strategy)
    if jax_cell(plan):
        run_processes(jax_cmd(plan, out), out, timeout, env or jax_env(plan, "cpu", 0, False))
        return collect(out, 1)
    try:
        ln = nodes.resolve(plan.launch)
    except nodes.NodesError as exc:
        raise LaunchError(str(exc)) from None
    plan = plan if ln == plan.launch else replace(plan, launch=ln)
    if ln.nnodes == 1:
        run_processes(torchrun_cmd(plan, out), out, timeout, done=records_written(out, plan.world))
        return collect(out, plan.world)
    try:
        run_processes(torchrun_cmd(plan, out), out, timeout, nodes.rank_env(ln), nodes.log_name(ln))
    except LaunchError as exc:
        raise LaunchError(f"{nodes.diagnose(ln, out / 'peers.json')}; {exc}") from None
    return collect(out, plan.world) if ln.node_rank == 0 else []


def main(argv=None) -> None:
    """One node's launcher, `python -m steps.sharding.launch --plan JSON --out DIR` (nodes.py): node 0
    prints the cell's metrics as one JSON line; a failure exits 1 with LaunchError's message."""
    from steps.sharding.plan_cli import plan_from_argv

    plan, out = plan_from_argv(argv)
    try:
        ranks = launch(plan, out)
    except LaunchError as exc:
        sys.exit(f"launch failed: {exc}")
    if ranks:
        from steps.sharding.summary import summarize

        print(json.dumps({k: v for k, v in summarize(plan, ranks).items() if isinstance(v, (int, float, str))}))


if __name__ == "__main__":
    main()
