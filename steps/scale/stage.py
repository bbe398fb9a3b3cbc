"""Stage `scale`: one (model, cluster, plan) per cell, at 8 to 1,024 GPUs, without a GPU.

A cell simulates one rank of the plan at full world size on torch's fake process group (the real
model under a FakeTensorMode, TP then FSDP2: steps/scale/fakeworld.py) and reads its state,
saved-activation and communication bytes; sets them against the Playbook's formulas
(steps/analytic/; which step runs and which formula each number meets: steps/scale/versus.py);
predicts the step time, tokens/s per GPU, MFU and memory per GPU on the cluster
(steps/scale/steptime.py); and, where the config names a published run of the same setup, divides
the prediction by it. A cell with `search: true` ranks every plan for its model, global
batch and world instead and reports the best one that fits (steps/scale/search.py). A cell with
`measured: [<sharding cells>]` replays the sharding stage's gloo cells on the fake group and sets
the simulated bytes against what their ranks measured (steps/scale/replay_sharding.py).
"""

from __future__ import annotations

import math

from steps.analytic.activations import activations
from steps.analytic.comm import by_collective
from steps.analytic.memory import held_state, state
from steps.core import InputError, Stage
from steps.models.shapes import Shape
from steps.presentation.scale import SHOWN
from steps.scale.cluster import Cluster
from steps.scale.scale_config import ScaleConfig
from steps.scale.scale_plan import ScalePlan
from steps.scale.search import best_plan
from steps.scale.steptime import predict
from steps.scale.versus import compare, simulable
from steps.sharding.plan import PlanError

GiB = 2**30


def resolve(ctx, p: ScaleConfig) -> tuple[Shape, Cluster]:
    """The cell's model (a shape of steps/models/shapes.py, by name, with its `model_overrides`) and
    cluster (scale.clusters)."""
    if p.cluster not in p.clusters:
        raise InputError(
            f"scale.cells.{ctx.cell}.cluster = {p.cluster!r} is not in scale.clusters "
            f"(declared: {sorted(p.clusters)}); fix the cell or add it there"
        )
    try:
        shape = Shape.of(p.model, f"scale.cells.{ctx.cell}.model", **p.model_overrides)
    except (KeyError, ValueError) as exc:
        raise InputError(exc.args[0]) from None
    return shape, Cluster.from_config(p.cluster, p.clusters[p.cluster])


def blank() -> dict:
    """Every metric a column reads, NaN until the cell has it (analytic-only plans, no published run,
    search cells): each cell returns the same keys."""
    keys = [ref.partition(".")[2] for ref in STAGE.columns.values() if ref.startswith("metrics.")]
    return dict.fromkeys([*keys, "saved_ratio_torch_sp"], math.nan)


def run(ctx) -> dict:
    try:
        p = ScaleConfig.of(ctx.params)
    except PlanError as exc:
        raise InputError(f"scale.cells.{ctx.cell}.plan: {exc}") from None
    if p.measured:
        return blank() | ours_cell(ctx, p)
    shape, cluster = resolve(ctx, p)
    pub = p.published
    source = " — ".join(x for x in (pub.source, pub.note) if x)
    ctx.info.update(source=source, memory="", comm="", batch="")
    if p.search:
        return blank() | search_cell(ctx, shape, cluster, p)

    plan = p.plan
    check_moe(ctx.cell, shape, plan)
    pred = predict(shape, plan, cluster)
    an_state = state(shape, plan)["state"]
    held = held_state(shape, plan)["state"]
    an_saved = activations(shape, plan, ac="none")["saved"]
    sim = simulable(shape, plan)
    an_comm = sum(by_collective(shape, plan).values())
    m = blank() | {
        "world": plan.world,
        "params": shape.params,
        "state_gib_analytic": an_state / GiB,
        "predicted_state_gib_held": held / GiB,
        "saved_gib_analytic": an_saved / GiB,
        "comm_gib_analytic": an_comm / GiB,
        **predicted(pred),
        "predicted_step_s": pred["step_s"],
        "predicted_exposed_comm_s": pred["exposed_comm_s"],
        "predicted_all_to_all_s": pred["all_to_all_s"],
        "predicted_bubble": pred["bubble"],
        "predicted_mem_activations_gib": pred["mem_activations"] / GiB,
    }
    memory = f"analytic only: state {an_state / GiB:.2f} Playbook / {held / GiB:.2f} predicted GiB, "
    memory += f"saved (no AC) {an_saved / GiB:.2f}"
    ctx.info["comm"] = "analytic only"
    if sim:
        measured, memory, ctx.info["comm"], ctx.info["comm_sim"] = compare(shape, plan)
        m |= measured
    if pub.tokens_per_s_gpu:
        m["published_tokens_per_s_gpu"] = pub.tokens_per_s_gpu
        m["predicted_published_ratio"] = pred["tokens_per_s_gpu"] / pub.tokens_per_s_gpu
    if pub.memory_gib:  # an allocator peak (reserved, fragmentation included) against counted tensors
        m["published_memory_gib"] = pub.memory_gib
        m["predicted_published_mem_ratio"] = m["predicted_mem_gib"] / pub.memory_gib
    mem = f"{m['predicted_mem_gib']:.1f} GiB of {cluster.memory_bytes / GiB:.0f}"
    ctx.info.update(
        model=shape.name,
        cluster=cluster.name,
        plan=plan.name,
        mesh=plan.mesh_str,
        batch=f"{plan.local_batch} × {plan.seq}",
        memory=memory,
        fits=("fits: " if pred["fits"] else "DOES NOT FIT: ") + mem,
    )
    return m


def predicted(pred: dict) -> dict:
    """The step-time model's headline outputs as the stage logs them: every name says `predicted_`, so
    none reads as the measured `mfu`, `tokens_per_s_gpu`, `step_s` of perf and gpt_train."""
    return {
        "predicted_tokens_per_s_gpu": pred["tokens_per_s_gpu"],
        "predicted_mfu": pred["mfu"],
        "predicted_mem_gib": pred["mem_total"] / GiB,
        "predicted_fits": pred["fits"],
    }


def check_moe(cell: str, shape: Shape, plan: ScalePlan) -> None:
    """Expert parallelism needs experts to split; an MoE is modelled with data axes and ep only."""
    ep = plan.axis("ep")
    if ep > 1 and (not shape.experts or shape.experts % ep):
        raise InputError(
            f"scale.cells.{cell}.plan.mesh.ep = {ep}: model {shape.name} has {shape.experts} experts per layer; "
            "ep must divide them (a dense model: drop ep)"
        )
    if shape.experts and (plan.axis("tp") > 1 or plan.axis("pp") > 1):
        raise InputError(f"scale.cells.{cell}: an MoE model ({shape.name}) is modelled with dp, fsdp and ep only")


def search_cell(ctx, shape: Shape, cluster: Cluster, p: ScaleConfig) -> dict:
    s = p.search_for
    unset = [k for k in ("world", "global_batch", "seq") if getattr(s, k) is None]
    if unset:
        raise InputError(f"scale.cells.{ctx.cell}: a search cell needs search_for.{', search_for.'.join(unset)}")
    (plan, pred), tried, fitting = best_plan(shape, cluster, s.world, s.global_batch, s.seq)
    ctx.info.update(model=shape.name, cluster=cluster.name, mesh="search")
    if plan is None:
        ctx.info.update(
            plan="none fits",
            fits=f"DOES NOT FIT: smallest of {tried} plans needs {pred['mem_total'] / GiB:.1f} GiB "
            f"> {cluster.memory_bytes / GiB:.0f} GiB per GPU",
        )
        return {"world": s.world, "plans_tried": tried, "plans_fitting": 0, "predicted_fits": 0.0}
    ctx.info.update(
        plan=f"best: {plan.name} (local batch {plan.local_batch})",
        mesh=plan.mesh_str,
        batch=f"{plan.local_batch} × {plan.seq}",
        fits=f"fits: {pred['mem_total'] / GiB:.1f} GiB of {cluster.memory_bytes / GiB:.0f} ({fitting} of {tried} fit)",
    )
    return {
        "world": s.world,
        "plans_tried": tried,
        "plans_fitting": fitting,
        **predicted(pred),
    }


def ours_cell(ctx, p: ScaleConfig) -> dict:
    """The sharding stage's gloo cells (`measured`, their plans in `sharding_plans`, their
    metrics.json the job's inputs) replayed by the simulator: state and comm bytes, sim ÷ gloo."""
    from steps.scale.replay_sharding import check  # torch: only this cell (stage.py stays torch-free otherwise)

    missing = [c for c in p.measured if c not in (p.sharding_plans or {})]
    if missing:
        raise InputError(f"scale.cells.{ctx.cell}.measured names {missing}, not cells of the sharding section")
    rows = check({c: p.sharding_plans[c] for c in p.measured}, {c: ctx.inputs[c] for c in p.measured})
    worst = {k: max((r[k] for r in rows), key=lambda x: abs(x - 1)) for k in ("state_ratio", "comm_ratio")}
    ctx.info.update(
        model="sharding.gpt",
        cluster="this machine (gloo)",
        plan="gloo cells replayed: " + ", ".join(p.measured),
        mesh="world 2-4",
        batch="the cells' own",
        comm="in the memory column (sim ÷ gloo)",
        memory="; ".join(
            f"{r['cell']}: state {r['state_bytes_sim']:,.0f} sim / {r['state_bytes_gloo']:,.0f} gloo B, "
            f"comm {r['comm_bytes_sim']:,.0f} / {r['comm_bytes_gloo']:,.0f} B"
            for r in rows
        ),
        fits="",
    )
    return {"world": max(r["world"] for r in rows), "state_ratio_gloo": worst["state_ratio"],
            "comm_ratio_gloo": worst["comm_ratio"]}  # fmt: skip


STAGE = Stage.of("steps.scale", run, SHOWN)  # a package stage: its name is the package's
