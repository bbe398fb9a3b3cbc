"""The scale stage: the fake-world step against the Playbook formulas (exact on tiny models), the
α–β model on hand-computed cases, a published run reproduced within its tolerance, and a plan
that does not fit saying so with the numbers."""

from __future__ import annotations

import json

import pytest

from steps.analytic import activations as Act
from steps.analytic import comm as C
from steps.analytic import memory as M
from steps.analytic import params as P
from steps.config import cell_config, load_config
from steps.core import InputError
from steps.models.shapes import GPT2, LLAMA3, Shape
from steps.scale.cluster import Cluster, Link
from steps.scale.fakeworld import leave_fake_world
from steps.scale.scale_plan import ScalePlan
from steps.scale.steptime import memory, predict
from steps.sharding.plan import PlanError
from tests.conftest import DEFAULT, assert_matches_single_device, run_stage

SIZES = dict(n_embd=64, n_layer=3, n_head=8, vocab_size=256, block_size=32)
TINY = {  # GPTConfig fields of the two families (steps/models/shapes.py)
    "llama": dict(LLAMA3, **SIZES, n_kv_head=4, mlp_hidden=128),
    "gpt2": dict(GPT2, **SIZES),
}
MESHES = [{"fsdp": 8}, {"fsdp": 2, "tp": 4}, {"dp": 2, "fsdp": 2, "tp": 2}, {"dp": 8}]
CLUSTER = dict(
    gpus_per_node=8,
    gpu_memory_gib=80,
    peak_tflops=1000,
    mfu=0.5,
    intra={"bandwidth_gbs": 400, "latency_us": 2},
    inter={"bandwidth_gbs": 50, "latency_us": 10},
)


@pytest.fixture(autouse=True, scope="module")
def no_fake_world_left_behind():
    """steps.scale keeps its fake process group between simulations (one per job); these tests end it,
    so later test modules can start a real one (test_sharding's gloo world of one)."""
    yield
    leave_fake_world()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "x".join(f"{k}{v}" for k, v in m.items()))
def test_fake_world_step_equals_analytic_bytes(family, mesh):
    """World 8, FSDP2 / TP / HSDP / DP on the real module: state and communication bytes equal the
    formulas exactly; saved activations too, but for the 4-byte fp32 loss scalar."""
    from steps.scale import fakeworld as fw

    shape = Shape.from_fields("tiny", TINY[family])
    plan = ScalePlan.from_params({"mesh": mesh, "local_batch": 2, "seq": 32})
    step = fw.simulate(shape, mesh, 2, 32)
    assert step.state == M.state(shape, plan)["state"]
    assert step.state == memory(shape, plan)["state"] == M.held_state(shape, plan)["state"]  # what `fits` uses
    assert step.params == P.local_params(shape, plan) * M.FP32 / plan.axis("fsdp")  # fp32 shards, HSDP: over fsdp
    analytic_comm = C.by_collective(shape, plan)
    assert {k: v for k, v in step.comm.items() if v} == pytest.approx(analytic_comm, rel=1e-12)
    assert step.saved - Act.activations(shape, plan, ac="none")["saved"] == 4
    tokens = 2 * 32
    assert step.saved_per_layer == Act.layer_bytes_per_token(shape, plan) * tokens
    if plan.axis("tp") == 1:  # docs/scale.md's term-by-term gap to the Playbook's 34·d, against the simulation
        from steps.scale.versus import playbook_gap_terms

        gap = sum(playbook_gap_terms(shape).values()) * tokens
        assert step.saved_per_layer - Act.korthikanti_per_layer(shape, plan) == gap
        assert Act.korthikanti_per_layer(shape, plan) == 34 * shape.d * tokens


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("mesh", [{"dp": 8}, {"dp": 2, "tp": 4}], ids=["dp8", "dp2xtp4"])
def test_zero2_predicted_state_equals_the_simulated_state(family, mesh):
    """ZeRO-2 as simulated (FSDP2, reshard_after_forward=False): the fp32 shards and the held bf16
    parameters are what the memory prediction (and so `fits`) counts, to the byte: 2Ψ + 16Ψ/N,
    where the reported Playbook state is 2Ψ + 14Ψ/N."""
    from steps.scale import fakeworld as fw
    from steps.scale.versus import setup

    shape = Shape.from_fields("tiny", TINY[family])
    plan = ScalePlan.from_params({"mesh": mesh, "zero": 2, "local_batch": 2, "seq": 32})
    sizes, recipe, _ = setup(shape, plan)
    step = fw.simulate(shape, sizes, 2, 32, recipe)
    psi, n = P.local_params(shape, plan), plan.axis("dp")
    assert step.state + step.gathered == memory(shape, plan)["state"] == 2 * psi + 16 * psi / n
    assert M.state(shape, plan)["state"] == 2 * psi + 14 * psi / n


def test_zero1_predicted_state_holds_gradients_in_the_comm_dtype():
    """ZeRO-1 (Megatron-Core's distributed optimizer, analytic only): the fp32 gradients its
    reduce-scatter sends are held whole, 6Ψ + 12Ψ/N; the Playbook's bf16 gradients give 4Ψ + 12Ψ/N."""
    shape = Shape.from_fields("tiny", TINY["llama"])
    plan = ScalePlan.from_params({"mesh": {"dp": 8}, "zero": 1, "local_batch": 2, "seq": 32})
    psi, held = P.local_params(shape, plan), M.held_state(shape, plan)
    comm_dtype = C.by_collective(shape, plan)["dp/reduce_scatter"] / C.ring_bytes("reduce_scatter", psi, 8)
    assert comm_dtype == M.FP32 and held["grads"] == comm_dtype * psi
    assert memory(shape, plan)["state"] == held["state"] == 6 * psi + 12 * psi / 8
    assert M.state(shape, plan)["state"] == 4 * psi + 12 * psi / 8
    assert predict(shape, plan, Cluster.from_config("t", CLUSTER))["mem_state"] == held["state"]


def test_depth_extrapolation_equals_a_full_depth_step():
    from steps.scale import fakeworld as fw

    shape = Shape.from_fields("tiny", {**TINY["llama"], "n_layer": 4})
    mesh = {"fsdp": 2, "tp": 4}
    extrapolated = fw.simulate(shape, mesh, 2, 32)
    direct = fw.one_step(shape, fw.mesh_for(mesh), 4, 2, 32)
    assert (extrapolated.params, extrapolated.grads, extrapolated.optim, extrapolated.saved) == (
        direct.params,
        direct.grads,
        direct.optim,
        direct.saved,
    )
    assert {k: v for k, v in extrapolated.comm.items() if v} == {k: v for k, v in direct.comm.items() if v}


def test_alpha_beta_by_hand():
    c = Cluster.from_config("t", CLUSTER)
    # 1 GB all-reduce over 8 GPUs of one node: 2·7 hops of 2 µs, 2·7/8 GB at 400 GB/s
    nbytes = C.ring_bytes("all_reduce", 1e9, 8)
    assert nbytes == 1.75e9
    assert c.collective_time("all_reduce", nbytes, 8, c.intra) == pytest.approx(14 * 2e-6 + 1.75e9 / 400e9)
    # 3 all-gathers over 16 ranks across nodes: 3·15 hops of 10 µs
    assert c.collective_time("all_gather", 1.5e9, 16, c.inter, calls=3) == pytest.approx(45e-5 + 1.5e9 / 50e9)
    assert c.collective_time("all_reduce", 1e9, 1, c.intra) == 0.0
    plan = ScalePlan.from_params({"mesh": {"fsdp": 16, "tp": 8}})
    assert c.link(plan, "tp") == c.intra and c.link(plan, "fsdp") == c.inter  # tp innermost: one node
    assert c.link(ScalePlan.from_params({"mesh": {"fsdp": 4, "tp": 2}}), "fsdp") == Link(400e9, 2e-6)


def test_step_time_by_hand():
    """fsdp8 in one node, no AC: compute = FLOPs/(mfu·peak); the FSDP collectives hide but for
    one layer's share; tokens/s = tokens / step / world."""
    shape = Shape.from_fields(
        "tiny", {**TINY["llama"], "n_embd": 1024, "mlp_hidden": 4096, "n_head": 16, "n_kv_head": 16}
    )
    plan = ScalePlan.from_params({"mesh": {"fsdp": 8}, "local_batch": 4, "seq": 1024})
    c = Cluster.from_config("t", CLUSTER)
    r = predict(shape, plan, c)
    tokens = 8 * 4 * 1024
    compute = shape.flops_per_token(1024) * tokens / 8 / 0.5e15
    comm = C.by_collective(shape, plan)
    t_ag = 7 * 2e-6 * (2 * 3 + 1) + comm["fsdp/all_gather"] / 400e9
    t_rs = 7 * 2e-6 * (3 + 1) + comm["fsdp/reduce_scatter"] / 400e9
    step = compute + max(0.0, t_ag + t_rs - compute) + (t_ag + t_rs) / 4
    assert r["compute_s"] == pytest.approx(compute)
    assert r["step_s"] == pytest.approx(step)
    assert r["tokens_per_s_gpu"] == pytest.approx(tokens / step / 8)
    # MFU: model FLOPs at that rate over the 1000 TFLOP/s peak; no AC, so 0.5 (the input) × compute ÷ step
    assert r["mfu"] == pytest.approx(shape.flops_per_token(1024) * tokens / step / 8 / 1e15)
    assert r["mfu"] == pytest.approx(0.5 * compute / step) and r["mfu"] < 0.5
    pp = predict(shape, ScalePlan.from_params({"mesh": {"pp": 3}, "local_batch": 4, "microbatches": 4, "seq": 1024}), c)
    assert pp["bubble"] == pytest.approx(2 / 4)


def test_predicted_mfu_falls_as_communication_grows():
    """test_step_time_by_hand's plan over 16 GPUs (fsdp across two nodes), links 1000× and 10× faster,
    as given and 10× slower: compute is unchanged, the exposed communication grows, and MFU and
    tokens/s fall step by step (no AC: MFU = 0.5 × compute ÷ (compute + exposed)); with near-free
    links MFU reaches the cluster's 0.5 to 0.1 %, at the given 50 GB/s between nodes it is 0.12."""
    shape = Shape.from_fields(
        "tiny", {**TINY["llama"], "n_embd": 1024, "mlp_hidden": 4096, "n_head": 16, "n_kv_head": 16}
    )
    plan = ScalePlan.from_params({"mesh": {"fsdp": 16}, "local_batch": 4, "seq": 1024})

    def on(scale: float) -> dict:
        links = {
            k: {"bandwidth_gbs": CLUSTER[k]["bandwidth_gbs"] * scale, "latency_us": CLUSTER[k]["latency_us"] / scale}
            for k in ("intra", "inter")
        }
        return predict(shape, plan, Cluster.from_config("t", {**CLUSTER, **links}))

    runs = [on(s) for s in (1000, 10, 1, 0.1)]
    assert len({r["compute_s"] for r in runs}) == 1
    exposed, mfu, tps = ([r[k] for r in runs] for k in ("exposed_comm_s", "mfu", "tokens_per_s_gpu"))
    assert exposed == sorted(exposed) and len(set(exposed)) == 4
    assert mfu == sorted(mfu, reverse=True) and tps == sorted(tps, reverse=True) and len(set(mfu)) == 4
    assert 0.4995 < mfu[0] < 0.5
    for r in runs:
        assert r["mfu"] == pytest.approx(0.5 * r["compute_s"] / (r["compute_s"] + r["exposed_comm_s"]))


def published_cell(name: str):
    cfg = cell_config(load_config(DEFAULT), "scale", name)["params"]
    shape = Shape.of(cfg["model"])
    cluster = Cluster.from_config(cfg["cluster"], cfg["clusters"][cfg["cluster"]])
    return shape, ScalePlan.from_params(cfg["plan"]), cluster, cfg["published"]


@pytest.mark.parametrize("cell", ["titan_8b_fsdp8", "titan_8b_fsdp128"])
def test_published_torchtitan_run_within_25_percent(cell):
    shape, plan, cluster, pub = published_cell(cell)
    r = predict(shape, plan, cluster)
    assert abs(r["tokens_per_s_gpu"] / pub["tokens_per_s_gpu"] - 1) <= 0.25, r["tokens_per_s_gpu"]
    assert r["fits"] == 1.0


def test_published_memory_difference_is_the_state_difference():
    """82.4 GiB at 8 GPUs, 67.0 at 128 (torchtitan Tables 1, 3): only the FSDP shards differ."""
    (s8, p8, _, m8), (s128, p128, _, m128) = published_cell("titan_8b_fsdp8"), published_cell("titan_8b_fsdp128")
    drop = (M.state(s8, p8)["state"] - M.state(s128, p128)["state"]) / 2**30
    assert drop == pytest.approx(m8["memory_gib"] - m128["memory_gib"], rel=0.15)


def test_plan_checks_name_the_key():
    with pytest.raises(PlanError, match="mesh axes"):
        ScalePlan.from_params({"mesh": {"cp": 2}})
    with pytest.raises(PlanError, match="ZeRO-3"):
        ScalePlan.from_params({"mesh": {"fsdp": 8}, "zero": 1})


def test_a_plan_that_does_not_fit_says_so(tmp_path):
    """Llama-3-70B on one 8-GPU node: no plan fits, and the cell says how much the smallest needs."""
    params = cell_config(load_config(DEFAULT), "scale", "best_70b_1024")["params"]
    params["search_for"] = {"world": 8, "global_batch": 8, "seq": 8192}
    run_stage(tmp_path, "scale", params, cell="best_70b_8")
    rec = json.loads((tmp_path / "results/scale/best_70b_8/metrics.json").read_text())
    assert rec["metrics"]["predicted_fits"] == 0.0
    assert rec["info"]["plan"] == "none fits"
    needs = float(rec["info"]["fits"].split("needs ")[1].split(" GiB")[0])
    assert needs > 80 and "> 80 GiB per GPU" in rec["info"]["fits"]
    assert rec["metrics"]["published_memory_gib"] is None and rec["metrics"]["predicted_published_mem_ratio"] is None
    shape, plan, cluster, _ = published_cell("titan_8b_fsdp8")
    dp = predict(shape, ScalePlan.from_params({"mesh": {"dp": 8}, "local_batch": 1, "seq": 8192}), cluster)
    assert dp["fits"] == 0.0 and dp["mem_state"] == 16 * shape.params  # 16 bytes/param replicated


def test_unknown_model_is_an_input_error(tmp_path):
    params = cell_config(load_config(DEFAULT), "scale", "best_8b_64")["params"]
    proc = run_stage(tmp_path, "scale", {**params, "model": "llama9"}, cell="bad", check=False)
    assert proc.returncode != 0 and "scale.cells.bad.model = 'llama9'" in proc.stderr
    assert "known: gpt2-124m" in proc.stderr and "llama-3.1-8b" in proc.stderr


# ---- checked against our own runs: the sharding stage's gloo cells replayed on the fake group ----
GLOO_CELLS = ["native_ddp", "native_fsdp2", "native_tp", "native_dp_tp", "native_fsdp_tp", "native_tp_sp"]


def sharding_params(cell: str) -> dict:
    return {**cell_config(load_config(DEFAULT), "sharding", cell)["params"], "steps": 2}


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    """The default config's native GPT cells, really run (torchrun, gloo, world 2-4, 2 steps)."""
    work = tmp_path_factory.mktemp("gloo")
    for cell in GLOO_CELLS:
        run_stage(work, "sharding", sharding_params(cell), cell=cell)
    return {c: work / f"results/sharding/{c}/metrics.json" for c in GLOO_CELLS}


def test_gloo_cells_are_the_native_strategies_on_one_host():
    """The torch_native GPT strategies test_sharding.py leaves to the gloo cells (DDP, FSDP2, TP with
    sequence parallel, fsdp×tp; TP and dp×tp besides): the default config must keep running them."""
    from steps.sharding.plan import Plan

    plans = [Plan.from_params(sharding_params(c)) for c in GLOO_CELLS]
    assert {(p.backend, p.model, p.optimizer, p.launch.nnodes) for p in plans} == {("torch_native", "gpt", "sgd", 1)}
    assert [(p.strategy, dict(p.mesh), p.sequence_parallel) for p in plans] == [
        ("dp", {"dp": 2}, False),
        ("fsdp", {"fsdp": 2}, False),
        ("tp", {"tp": 2}, False),
        ("dp_tp", {"dp": 2, "tp": 2}, False),
        ("fsdp_tp", {"fsdp": 2, "tp": 2}, False),
        ("tp", {"tp": 2}, True),
    ]


PARITY_KEYS = ("parity_ok", "parity_err_worst", "parity_max_dloss", "parity_max_dgrad", "parity_max_dparam",
               "parity_replica_spread", "state_ratio", "dispatch_comm_ratio")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("cell", GLOO_CELLS)
def test_native_gloo_cell_matches_single_device(gloo_runs, cell):
    """test_sharding.py's test_strategy_matches_single_device on the gloo cells above (the suite's
    only launch of these torch_native strategies): every rank's record against one device, and the
    cell's metrics.json carries the same verdict."""
    from steps.sharding.launch import collect
    from steps.sharding.plan import Plan
    from steps.sharding.summary import summarize

    p = Plan.from_params({**sharding_params(cell), "seed": 1234})  # run_stage's seed
    ranks = collect(gloo_runs[cell].parent / "ranks", p.world)
    m = summarize(p, ranks)
    assert_matches_single_device(p, ranks, m)
    rec = json.loads(gloo_runs[cell].read_text())
    assert rec["status"] == "ok"
    assert {k: rec["metrics"][k] for k in PARITY_KEYS} == {k: m[k] for k in PARITY_KEYS}


@pytest.mark.slow
@pytest.mark.parametrize("cell", GLOO_CELLS[:-1])
def test_simulated_bytes_equal_the_gloo_cells_exactly(gloo_runs, cell):
    """DP (DDP, simulated as HSDP with a shard axis of one), FSDP2, TP, dp×tp, fsdp×tp: rank 0's
    state after the step and its first step's collective bytes, simulated = measured on gloo."""
    from steps.scale.replay_sharding import measured, replay
    from steps.sharding.plan import Plan

    sim, got = replay(Plan.from_params({**sharding_params(cell), "seed": 0})), measured(gloo_runs[cell])
    assert sim["state_bytes"] == got["state_bytes"]
    assert sim["comm_bytes"] == got["comm_bytes"]
    if cell == "native_ddp":  # the second step also broadcasts DDP's rebuilt bucket order, once
        assert got["comm_steps"][1] - got["comm_steps"][0] == 76
    else:
        assert set(got["comm_steps"]) == {got["comm_bytes"]}


@pytest.mark.slow
def test_sequence_parallel_gap_is_the_norm_gradients(gloo_runs):
    """SP: the replay also counts the all-reduce of the sequence-parallel norms' gradients, which
    FSDP2's post-backward issues; the gloo cell (no FSDP) runs it in the optimizer step, outside
    its counter. 2 layers × 2 LayerNorms × (weight + bias) of 32 fp32, ring factor 1 at tp = 2."""
    from steps.scale.replay_sharding import measured, replay
    from steps.sharding.plan import Plan

    sim = replay(Plan.from_params({**sharding_params("native_tp_sp"), "seed": 0}))
    got = measured(gloo_runs["native_tp_sp"])
    assert sim["state_bytes"] == got["state_bytes"]
    assert sim["comm_bytes"] - got["comm_bytes"] == 2 * 2 * 2 * 32 * 4


@pytest.mark.slow
def test_scale_cell_reports_sim_over_gloo(gloo_runs, tmp_path):
    params = cell_config(load_config(DEFAULT), "scale", "ours_gloo")["params"]
    params["sharding_plans"] = {c: sharding_params(c) for c in params["measured"]}
    inputs = {c: str(gloo_runs[c]) for c in params["measured"]}
    run_stage(tmp_path, "scale", params, cell="ours_gloo", inputs=inputs)
    rec = json.loads((tmp_path / "results/scale/ours_gloo/metrics.json").read_text())
    assert rec["metrics"]["state_ratio_gloo"] == 1.0 and rec["metrics"]["comm_ratio_gloo"] == 1.0
    assert rec["metrics"]["world"] == 4 and "native_fsdp2: state" in rec["info"]["memory"]


def test_swiglu_gqa_under_tp_equals_analytic():
    """Our GPT with the Llama options (SwiGLU, 2 kv heads of 4) under TP and FSDP×TP at world 2/4 on
    the fake group: the gate c_fc2 is sharded like c_fc, and q/k/v (c_fc/c_fc2) take one DTensor
    input, so state and comm equal the sharding stage's analytic model exactly."""
    import torch

    from steps.analytic.costs import gpt_costs
    from steps.scale.replay_sharding import replay
    from steps.sharding.gpt_init import full_model
    from steps.sharding.plan import Plan

    gpt = dict(vocab_size=128, block_size=16, n_layer=2, n_head=4, n_embd=32, mlp="swiglu", n_kv_head=2, bias=False)
    for mesh, strategy in (({"tp": 2}, "tp"), ({"fsdp": 2, "tp": 2}, "fsdp_tp")):
        plan = Plan.from_params(
            dict(backend="torch_native", model="gpt", optimizer="sgd", strategy=strategy, mesh=mesh, gpt=gpt, seed=0)
        )
        model = full_model(plan, torch.float32)
        shapes = {k: p.numel() for k, p in model.named_parameters()}
        assert "transformer.h.0.mlp.c_fc2.weight" in shapes
        sim, want = replay(plan), gpt_costs(plan, shapes)
        assert sim["state_bytes"] == want["state_bytes"] and sim["comm_bytes"] == want["comm_bytes"]


@pytest.mark.parametrize(
    "mesh,extra",
    [({"fsdp": 8}, {"ac": "full"}), ({"fsdp": 2, "tp": 4}, {"sp": True}), ({"dp": 8}, {"zero": 2}),
     ({"fsdp": 2, "tp": 4}, {"sp": True, "ac": "full"}), ({"dp": 2, "tp": 4}, {"ac": "full", "zero": 2})],
    ids=["ac_full", "sp", "zero2", "sp_ac_full", "tp_ac_full_zero2"],
)  # fmt: skip
def test_simulated_ac_sp_zero2_against_analytic(mesh, extra):
    """Our GPT at world 8 with full AC (checkpoint_activations), sequence parallel, ZeRO-2 (FSDP2
    reshard_after_forward=False): communication equals the formulas exactly (full AC rebuilds all
    but each block's last TP collective); the forward's saved bytes equal `kept` (+ the 4-byte
    loss); SP saves torch's gathered norm outputs on top of Megatron's count; ZeRO-2's state is the
    Playbook's + 2Ψ/N (FSDP2's gradient shards are fp32)."""
    from steps.scale import fakeworld as fw
    from steps.scale.versus import compare, setup

    shape = Shape.from_fields("tiny", TINY["gpt2"])
    plan = ScalePlan.from_params({"mesh": mesh, "local_batch": 2, "seq": 32, **extra})
    sizes, recipe, ac = setup(shape, plan)
    assert ac == plan.ac and recipe.reshard == (plan.zero_stage != 2)
    m, *_ = compare(shape, plan)
    assert m["comm_ratio"] == pytest.approx(1, rel=1e-12)
    step = fw.simulate(shape, sizes, 2, 32, recipe)
    act = Act.activations(shape, plan, ac=ac)
    n = plan.axis("dp") if plan.zero_stage == 2 else 1
    psi = P.local_params(shape, plan)
    assert step.state + (step.gathered if n > 1 else 0) == M.state(shape, plan)["state"] + 2 * psi / n * (n > 1)
    if ac == "full":  # a checkpointed layer keeps its input: the Playbook's 2·s·b·h (÷ t with SP), exactly
        assert step.saved_per_layer == Act.korthikanti_per_layer(shape, plan, "full")
    if plan.sp and ac == "full":  # the first block's checkpointed input is still whole (SP begins inside it)
        t = plan.axis("tp")
        assert step.saved - act["kept"] == 4 + 2 * shape.d * (1 - 1 / t) * 2 * 32
    else:
        assert step.saved - act["kept"] - act["sp_gathered"] == 4
    if plan.sp and ac == "none":
        assert act["sp_gathered"] > 0.15 * act["kept"]  # Megatron's formula alone is >15 % short here


def test_llama_plan_with_ac_compares_comm_like_for_like(tmp_path):
    """Llama AC is not simulated: the cell's sim ÷ analytic comm compares the step as simulated (no
    AC) on both sides and says so, while the plan's analytic comm (the step-time model's) adds the
    TP collectives full AC runs again — one per layer, `ac: full` over `ac: none`."""
    params = cell_config(load_config(DEFAULT), "scale", "l8b_fsdp8_tp8")["params"]
    params["model_overrides"] = {k: v for k, v in TINY["llama"].items() if k in (*SIZES, "n_kv_head", "mlp_hidden")}
    params.update(plan={"mesh": {"fsdp": 2, "tp": 4}, "local_batch": 2, "seq": 32, "ac": "full"})
    params["published"] = dict(tokens_per_s_gpu=1e6, memory_gib=0.5, source="made up", note="compile not modelled")
    run_stage(tmp_path, "scale", params, cell="tiny_ac")
    rec = json.loads((tmp_path / "results/scale/tiny_ac/metrics.json").read_text())
    m, info = rec["metrics"], rec["info"]
    assert m["published_memory_gib"] == 0.5
    assert m["predicted_published_mem_ratio"] == pytest.approx(m["predicted_mem_gib"] / 0.5)
    assert m["predicted_published_ratio"] == pytest.approx(m["predicted_tokens_per_s_gpu"] / 1e6)
    assert info["source"] == "made up — compile not modelled"
    assert m["comm_ratio"] == pytest.approx(1, rel=1e-12)
    assert info["comm"].endswith("analytic (no AC)")
    rebuilt = 3 * 2 * 32 * 64 * 2 * 2 * (4 - 1) / 4 / 2**30  # 3 layers × one all-reduce of (B, T, d) bf16, ring
    assert m["comm_gib_analytic"] - m["comm_gib_sim"] == pytest.approx(rebuilt, rel=1e-9)


def test_world_curves_styles_and_memory_lines(tmp_path, monkeypatch):
    """One series per (model, strategy, cluster, batch), none sharing a colour and marker; each
    cluster's GPU memory a horizontal line on the memory panel."""
    import matplotlib.axes
    import pandas as pd

    from steps.scale.figures import world_curves

    rows = [
        ("m1", "c80", "fsdp8", 8, "2 × 8192", "fits: 60.0 GiB of 80", 60.0, 5000.0),
        ("m1", "c80", "fsdp64", 64, "2 × 8192", "fits: 50.0 GiB of 80", 50.0, 4900.0),
        *[("m1", "c95", f"fsdp8 ac-{k}", 8, "2 × 8192", "fits: 1 GiB of 95", 1.0, 1.0) for k in ("full", "selective")],
        *[(f"m{i}", "c80", "dp8", 8, "1 × 1024", "DOES NOT FIT: 90 GiB of 80", 90.0, 1.0) for i in range(2, 15)],
    ]
    cols = ["model", "cluster", "plan", "world", "batch/rank (seqs × seq)", "predicted fits",
            "predicted memory/GPU (GiB)", "predicted tokens/s/GPU"]  # fmt: skip
    table = pd.DataFrame(rows, columns=cols).assign(status="ok")
    lines, hlines = [], []
    plot, axhline = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.axhline
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **k: lines.append(k) or plot(ax, *a, **k))
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", lambda ax, y, **k: hlines.append(y) or axhline(ax, y, **k))
    (path,) = world_curves(table, tmp_path)
    assert path.exists() and len(lines) == 2 * 16  # 16 series (fsdp8 and fsdp64 are one), on both panels
    assert len({(str(k["color"]), k["marker"]) for k in lines}) == 16
    assert sorted(hlines) == [80.0, 95.0]


TINY_MOE = dict(
    vocab_size=256, block_size=32, n_layer=3, n_head=8, n_kv_head=4, n_embd=64, mlp_hidden=96,
    moe={"experts": 8, "top_k": 2, "aux_loss_coef": 0.02},
)  # fmt: skip


@pytest.mark.parametrize("mesh", [{"fsdp": 8}, {"fsdp": 2, "ep": 4}, {"ep": 8}], ids=["fsdp8", "fsdp2xep4", "ep8"])
def test_moe_fake_world_step_equals_analytic_bytes(monkeypatch, mesh):
    """A tiny Mixtral-like MoE (8 experts, top-2) at world 8: FSDP2 alone, and expert parallelism with
    the dense parameters FSDP2 over fsdp × ep and the experts over ep then fsdp (steps/scale/balanced_moe.py):
    the simulated state and every collective's bytes (the all-to-alls included) equal analytic.py's."""
    from steps.models.shapes import SHAPES
    from steps.scale import fakeworld as fw

    monkeypatch.setitem(SHAPES, "tiny-moe", dict(SHAPES["mixtral-8x7b"], **TINY_MOE))
    shape = Shape.of("tiny-moe")
    assert (shape.experts, shape.top_k) == (8, 2)
    from steps.models.shapes import active_param_count, param_count

    assert (shape.params, shape.active_params()) == (param_count("tiny-moe"), active_param_count("tiny-moe"))
    plan = ScalePlan.from_params({"mesh": mesh, "local_batch": 2, "seq": 32})
    step = fw.simulate(shape, mesh, 2, 32)
    assert step.state == M.state(shape, plan)["state"] == M.held_state(shape, plan)["state"]
    assert step.state == 16 * shape.params / 8  # every byte sharded over the 8 ranks
    simulated = {k: v for k, v in step.comm.items() if v}
    assert simulated == pytest.approx(C.by_collective(shape, plan), rel=1e-12)
    if plan.axis("ep") > 1:  # four (b·s·k, d) bf16 all-to-alls a layer and the E int64 counts, over ep
        n = plan.axis("ep")
        rows = 4 * C.ring_bytes("all_to_all", 2 * 32 * 2 * 64 * M.BF16, n) + C.ring_bytes("all_to_all", 8 * 8, n)
        assert simulated["ep/all_to_all"] == 3 * rows


def test_moe_step_time_charges_the_all_to_all():
    """The α–β model prices EP's all-to-alls (ep inside a node: NVLink), all of them exposed."""
    from steps.scale.steptime import predict

    shape = Shape.of("mixtral-8x7b")
    c = Cluster.from_config("t", CLUSTER)
    inside = predict(shape, ScalePlan.from_params({"mesh": {"fsdp": 8, "ep": 8}, "seq": 4096}), c)
    assert inside["all_to_all_s"] > 0 and inside["exposed_comm_s"] >= inside["all_to_all_s"]
    # ep8 inside a node: 32 layers × 5 calls × 7 hops × 2 µs + the bytes at 400 GB/s
    nbytes = C.by_collective(shape, ScalePlan.from_params({"mesh": {"fsdp": 8, "ep": 8}, "seq": 4096}))["ep/all_to_all"]
    assert inside["all_to_all_s"] == pytest.approx(32 * 5 * 7 * 2e-6 + nbytes / 400e9, rel=1e-12)
    with pytest.raises(PlanError, match="ep"):
        ScalePlan.from_params({"mesh": {"ep": 8, "tp": 2}})


@pytest.mark.parametrize("sizes", [dict(top_k=2, n_embd=64), dict(top_k=4, n_embd=128, n_head=4, n_kv_head=2)])
def test_moe_saved_bytes_gap_is_the_documented_one(monkeypatch, sizes):
    """The simulated MoE layer's saved bytes exceed analytic.moe_bytes_per_token (+ the llama formula
    for the rest) by exactly the gap its docstring states: 6d + head_dim + 4 + k·(2d + 30) per token."""
    from steps.models.shapes import SHAPES
    from steps.scale import fakeworld as fw

    k = sizes.pop("top_k")
    spec = dict(SHAPES["mixtral-8x7b"], **{**TINY_MOE, **sizes})
    spec["moe"] = {**TINY_MOE["moe"], "top_k": k}
    monkeypatch.setitem(SHAPES, "tiny-moe", spec)
    shape = Shape.of("tiny-moe")
    plan = ScalePlan.from_params({"mesh": {"fsdp": 8}, "local_batch": 2, "seq": 32})
    step = fw.simulate(shape, {"fsdp": 8}, 2, 32)
    gap = step.saved_per_layer / (2 * 32) - Act.layer_bytes_per_token(shape, plan)
    d = shape.d
    assert gap == 6 * d + shape.head_dim + 4 + k * (2 * d + 30)


def test_moe_plan_errors_name_the_cell():
    from steps.scale.stage import check_moe

    dense = Shape.from_fields("tiny", TINY["llama"])
    mixtral = Shape.of("mixtral-8x7b")
    with pytest.raises(InputError, match=r"scale.cells.c.plan.mesh.ep = 4.*0 experts"):
        check_moe("c", dense, ScalePlan.from_params({"mesh": {"fsdp": 2, "ep": 4}}))
    with pytest.raises(InputError, match="ep must divide"):
        check_moe("c", mixtral, ScalePlan.from_params({"mesh": {"ep": 16}}))
    with pytest.raises(InputError, match="dp, fsdp and ep only"):
        check_moe("c", mixtral, ScalePlan.from_params({"mesh": {"fsdp": 8, "tp": 8}}))
    check_moe("c", mixtral, ScalePlan.from_params({"mesh": {"fsdp": 8, "ep": 8}}))  # fine
