"""Stage `sharding`: one parallelism plan per cell, run as real processes, checked against one device.

Each cell is a descriptive plan (steps/sharding/plan.py: mesh, strategy, schedule, backend, model)
run by the engine steps/sharding/engines.py names for its (backend, strategy).
Torch cells run `torchrun --nproc_per_node N -m steps.sharding.worker` (gloo on CPU, NCCL on CUDA:
one GPU per rank; gloo ranks fork from one preloaded forkserver: steps/sharding/torchrun.py);
JAX cells `python -m steps.sharding.jax` with N host devices, or N GPUs under device cuda. A cell
needing more GPUs than the node has is skipped ("needs N GPUs, found M"); device auto runs it on
the CPU instead (steps/sharding/launch.py). This job owns the cell's one
MLflow run: it gathers every rank's JSON and logs parity (loss, gradients, parameters after K
steps, on every rank, and the ranks against each other: steps/sharding/parity.py), tokens/s,
per-rank state bytes and dispatch-counted communication bytes (each collective as issued, not bytes on
the wire: docs/sharding.md) against the analytic model, and the pipeline bubble.
A cell whose worst parity error exceeds its tolerance (1e-12 fp64; fp32: 1e-5, or per tensor of a torch
cell twice one fp32 device's own error against the fp64 run where that is larger: parity.py) ends
FAILED with the numbers in its error, its MLflow metrics and <cell>/parity.json.
"""

from __future__ import annotations

import json
from dataclasses import replace

from steps.core import InputError, SkipCell, Stage
from steps.core.job import split_metrics
from steps.presentation.sharding import SHOWN
from steps.sharding import engines, nodes, parity
from steps.sharding import launch as launcher
from steps.sharding.plan import Plan, PlanError
from steps.sharding.summary import per_rank_table, summarize


def bar_charts(df, metrics: dict, title: str):
    """Per-rank state (stacked params/grads/optimizer, analytic line) and comm per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    bottom = None
    for col, colour in (("params_bytes", "C0"), ("grads_bytes", "C1"), ("optim_bytes", "C2")):
        ax1.bar(df["rank"], df[col] / 1024, bottom=bottom, color=colour, label=col.split("_")[0])
        bottom = df[col] / 1024 if bottom is None else bottom + df[col] / 1024
    ax1.axhline(metrics["state_bytes_analytic"] / 1024, color="k", ls="--", label="analytic")
    ax1.set(xlabel="rank", ylabel="KiB", title="state per rank")
    ax1.legend(fontsize=7)
    ax2.bar(df["rank"], df["dispatch_comm_bytes_step"] / 1024, color="C3", label="dispatch-counted")
    ax2.axhline(metrics["comm_bytes_analytic"] / 1024, color="k", ls="--", label="analytic")
    ax2.set(xlabel="rank", ylabel="KiB sent / step (ring convention)", title="communication per rank, as dispatched")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.set_xticks(df["rank"])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def placement(plan, device: str, n_gpus: int, jax_cuda: bool):
    """(plan with its torch process-group backend, env of a JAX cell's process) for `device` on a
    node with n_gpus GPUs; a cell needing more GPUs than that is skipped with
    "skipped: needs N GPUs, found M" (steps/sharding/launch.py says where each cell runs)."""
    try:
        if launcher.jax_cell(plan):
            return plan, launcher.jax_env(plan, device, n_gpus, jax_cuda)
        backend = launcher.torch_backend(plan, device, n_gpus)
    except launcher.NotEnoughGPUs as exc:
        raise SkipCell(str(exc)) from None
    if backend != plan.launch.dist_backend:
        plan = replace(plan, launch=replace(plan.launch, dist_backend=backend))
    return plan, None


def run(ctx) -> dict:
    try:
        plan = Plan.from_params({**ctx.params, "seed": ctx.seed})
        engines.entry(plan.backend, plan.strategy)  # a strategy its backend has no engine for
    except PlanError as exc:
        raise InputError(f"cell {ctx.cell}: {exc}") from None
    device = ctx.common.get("device", "cpu")
    gpu_possible = device != "cpu" or plan.launch.dist_backend == "nccl"  # cpu: no torch import
    # counted here rather than through ctx.device: "needs 2 GPUs, found 0" says more than "no CUDA"
    is_jax = launcher.jax_cell(plan)
    plan, env = placement(
        plan, device, launcher.cuda_gpus() if gpu_possible else 0, is_jax and gpu_possible and launcher.jax_has_cuda()
    )
    on_gpu = (env or {}).get("JAX_PLATFORMS") == "cuda" or (env is None and plan.launch.dist_backend == "nccl")
    ctx.info["placement"] = (
        (f"{plan.world} GPU(s), " if on_gpu else "CPU, ")
        + ("JAX" if is_jax else plan.launch.dist_backend)
        + (f", {plan.launch.nnodes} nodes" if plan.launch.nnodes > 1 else "")
    )
    ctx.set_tag("plan", plan.to_dict())
    node_rank = node_of(plan)
    if node_rank:
        raise InputError(
            f"cell {ctx.cell}: this job is node {node_rank} of {plan.launch.nnodes}; the stage runs on "
            "node 0 (it owns the MLflow run): start the other nodes with `python -m steps.sharding.launch "
            "--plan PLAN --out DIR` (steps/sharding/nodes.py)"
        )
    ranks = launcher.launch(plan, ctx.out / "ranks", env)
    if plan.backend == "jax_lessons":
        return lessons_metrics(ctx, ranks[0])
    m = summarize(plan, ranks)
    for step in range(len(ranks[0]["losses"])):
        ctx.log_metrics(
            {
                "loss": ranks[0]["losses"][step],
                "dgrad": max(r["dgrad"][step] for r in ranks),
                "dispatch_comm_bytes": ranks[0]["comm_bytes"][step],
            },
            step=step,
        )
    df = per_rank_table(ranks)
    ctx.log_table(df, "per_rank")
    title = f"{ctx.cell}: {plan.backend} {plan.pretty} mesh {plan.mesh_str}"
    ctx.log_figure(bar_charts(df, m, title), "memory_comm")
    for f in sorted((ctx.out / "ranks").glob("*.txt")):
        ctx.log_artifact(f, "sharding")
    ctx.info.update(
        backend=plan.backend,
        strategy=plan.pretty,
        mesh=plan.mesh_str,
        model=plan.model,
        dtype=plan.dtype,
        parity=f"{'ok' if m['parity_ok'] else 'FAIL'} {m['parity_err_worst']:.1e} {m['parity_worst_of']} "
        f"(tol {m['parity_tol']:.2g})",
        notes=notes(plan, m, ranks[0]),
        links=m.get("links", ""),
        state_split=" · ".join(f"{m[f'state_{k}_of_one_device']:.2f}" for k in ("params", "grads", "optim")),
        worst_param=ranks[0].get("dparam_where", ""),
    )
    if not m["parity_ok"]:
        fail(ctx, m)
    cores = plan.job_threads or ctx.threads
    if cores and cores < plan.world and not on_gpu:  # the scheduler may run another cell beside this one
        ctx.info["notes"] += f"; {plan.world} ranks on {cores} reserved core(s): tokens/s not timing-grade"
    return m


def node_of(plan) -> int:
    """This job's node (the cell's launch config, else SLURM's environment: nodes.resolve)."""
    try:
        return nodes.resolve(plan.launch).node_rank
    except nodes.NodesError as exc:
        raise InputError(str(exc)) from None


class ParityError(RuntimeError):
    """The sharded run does not match the single-device run within the plan's tolerance."""


def fail(ctx, m: dict) -> None:
    """End the cell FAILED with its numbers: in the error, the MLflow run's metrics and tags, and
    <cell>/parity.json (failed.json, written by the job, carries the error only)."""
    numbers, info = split_metrics(m)
    ctx.log_metrics({k: v for k, v in numbers.items() if v is not None})
    for k in ("parity", "parity_worst_of", "parity_worst_where"):
        ctx.set_tag(k, {**info, **ctx.info}.get(k, ""))
    error = parity.failure_message(m)
    record = {"status": "failed", "error": error, "metrics": numbers, "info": {**info, **ctx.info}}
    ctx.log_text(json.dumps(record, indent=2, default=str), "parity.json")
    raise ParityError(f"cell {ctx.cell}: {error}")


def notes(plan, m: dict, r0: dict) -> str:
    """What a reader needs next to the ratios: schedule, dtype/optimizer, which collectives ran."""
    out = [plan.model, plan.optimizer] + (["fp64"] if plan.dtype == "float64" else [])
    if plan.pipelined:
        inflight = int(m["max_inflight_microbatches"])  # counted by the from-scratch schedule only
        out.append(
            f"{plan.schedule} M={plan.microbatches} bubble {m['pipeline_bubble']:.2f}"
            + (f", max in flight {inflight}" if inflight else "")
        )
    if plan.sequence_parallel:
        out.append("SequenceParallel")
    out.append(
        r0.get("notes") or "collectives/step " + ", ".join(f"{k}×{v}" for k, v in r0.get("comm_calls", {}).items())
    )
    if "xb_dparam" in r0:
        out.append(f"torch↔JAX Δloss {r0['xb_dloss']:.1e} Δparam {r0['xb_dparam']:.1e}")
    return "; ".join(out)


def lessons_metrics(ctx, rec: dict) -> dict:
    """jax_lessons: jit speed-up, lax.cond vs Python branching, sharding renderings."""
    for f in sorted((ctx.out / "ranks").glob("*.txt")):
        ctx.log_artifact(f, "sharding")
    ctx.info.update(
        backend="jax_lessons", strategy="—", mesh=rec.get("mesh", ""), parity="", notes=rec.get("notes", ""), links=""
    )
    return {k: v for k, v in rec.items() if isinstance(v, (int, float))}


STAGE = Stage.of("steps.sharding", run, SHOWN)  # a package stage: its name is the package's
