"""Sharding: every strategy as real processes (torchrun / N JAX host devices) against one device,
and fail-fast launching (a killed or hung rank). The analytic cost model by hand: test_analytic.py."""

import json
import time

import pytest

from steps.sharding.launch import LaunchError, launch
from steps.sharding.plan import Plan, PlanError
from steps.sharding.scratch.pp import schedule_order
from steps.sharding.stage import summarize
from tests.conftest import assert_matches_single_device, processes_naming, run_module

TINY = {
    "mlp": {"dim": 8, "hidden": 16, "layers": 2},
    "batch_size": 8,
    "steps": 2,
    "gpt": {"vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16},
    "launch": {"timeout_s": 90},
}


def plan(**kw) -> Plan:
    return Plan.from_params({**TINY, **kw})


def test_one_f_one_b_order_holds_fewer_microbatches():
    assert schedule_order("1f1b", 0, 2, 4) == [
        ("F", 0),
        ("F", 1),
        ("B", 0),
        ("F", 2),
        ("B", 1),
        ("F", 3),
        ("B", 2),
        ("B", 3),
    ]
    assert schedule_order("1f1b", 1, 2, 4)[:2] == [("F", 0), ("B", 0)]
    assert schedule_order("gpipe", 0, 2, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]


def test_plan_rejects_inconsistent_mesh():
    with pytest.raises(PlanError, match="needs mesh axes"):
        Plan.from_params({"strategy": "dp_tp", "mesh": {"dp": 2, "fsdp": 2}})
    # the axes' order is the strategy's, whatever order the config (a job's sorted JSON) gives them in
    assert list(Plan.from_params({"strategy": "dp_tp", "mesh": {"tp": 2, "dp": 2}}).mesh) == ["dp", "tp"]
    with pytest.raises(PlanError, match="divide"):
        Plan.from_params({"strategy": "tp", "mesh": {"tp": 3}, "mlp": {"dim": 4, "hidden": 8, "layers": 2}})


# ---- real multi-process runs against one device ---------------------------------------------------
CASES = [
    ("torch_scratch", "dp", {"dp": 2}, {}),
    ("torch_scratch", "fsdp", {"fsdp": 2}, {}),
    ("torch_scratch", "tp", {"tp": 2}, {}),
    ("torch_scratch", "pp", {"pp": 2}, {"schedule": "1f1b", "microbatches": 4}),
    ("torch_scratch", "dp_tp", {"dp": 2, "tp": 2}, {}),
    # plain torchrun (each rank exec's a fresh interpreter, as under NCCL); the others fork (gloo)
    ("torch_scratch", "dp", {"dp": 2}, {"dtype": "float64", "launch": {"start_method": "exec"}}),
    # torch_native dp (DDP), fsdp (FSDP2), tp (+ sequence parallel), dp_tp and fsdp_tp on the GPT: the
    # default config's gloo cells, launched once for the scale replay and checked there with this
    # test's assertions (test_scale.py: GLOO_CELLS, test_native_gloo_cell_matches_single_device)
    ("torch_native", "pp", {"pp": 2}, {"model": "gpt", "optimizer": "sgd", "schedule": "gpipe"}),
    (  # HSDP × TP at world 8 (8 processes on 2 cores here: a longer timeout)
        "torch_native",
        "dp_fsdp_tp",
        {"dp": 2, "fsdp": 2, "tp": 2},
        {"model": "gpt", "optimizer": "sgd", "dtype": "float64", "launch": {"timeout_s": 300}},
    ),
    ("jax_jit", "dp_tp", {"dp": 2, "tp": 2}, {"cross_backend": True}),
    ("jax_shard_map", "fsdp_tp", {"fsdp": 2, "tp": 2}, {}),
    ("jax_shard_map", "dp_tp", {"dp": 2, "tp": 2}, {}),
    ("jax_shard_map", "tp", {"tp": 2}, {"model": "gpt", "optimizer": "sgd", "cross_backend": True}),
    ("jax_shard_map", "dp_fsdp_tp", {"dp": 2, "fsdp": 2, "tp": 2}, {"model": "gpt", "optimizer": "sgd"}),
    ("jax_jit", "dp_fsdp_tp", {"dp": 2, "fsdp": 2, "tp": 2}, {}),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend,strategy,mesh,extra",
    CASES,
    ids=[
        "-".join([c[0], c[1], "x".join(map(str, c[2].values())), c[3].get("model", "mlp")])
        + (f"-{c[3]['dtype']}" if c[3].get("dtype") else "")
        for c in CASES
    ],
)
def test_strategy_matches_single_device(tmp_path, backend, strategy, mesh, extra):
    p = plan(
        backend=backend,
        strategy=strategy,
        mesh=mesh,
        **{**extra, "launch": {**TINY["launch"], **extra.get("launch", {})}},
    )
    ranks = launch(p, tmp_path)
    assert_matches_single_device(p, ranks, summarize(p, ranks))
    if backend.startswith("torch"):  # how torchrun started them (launch.forked_ranks)
        assert {r["started"] for r in ranks} == {"forkserver" if p.launch.start_method == "auto" else "exec"}


MOE = {"experts": 8, "top_k": 2, "aux_loss_coef": 0.02}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch_scratch", "torch_native"])
def test_moe_under_dp_matches_one_device(tmp_path, backend):
    """The MoE GPT under plain DP, fp64, Adam: each rank's load-balancing loss must be the global
    batch's (router_stats.py). A per-shard aux loss (mean over ranks of E·Σ f_e P_e on each half)
    missed one device here by 1.9e-4 in the loss and 2.8e-3 in the parameters."""
    gpt = {**TINY["gpt"], "moe": MOE}
    p = plan(backend=backend, strategy="dp", mesh={"dp": 2}, model="gpt", dtype="float64", steps=3, gpt=gpt)
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert m["parity_ok"] == 1.0 and m["parity_err_worst"] <= 1e-12, m
    # the statistics' all-reduce (2E numbers per layer, forward and backward) is in the analytic bytes
    ratio = m["dispatch_comm_ratio"]
    assert abs(ratio - 1) <= (1e-12 if backend == "torch_scratch" else 0.01), ratio


# ---- MoE × 3-D (HSDP × TP), and fp32 tolerances from the fp64 run (#48 3) -------------------------
MOE_3D = {
    "backend": "torch_native",
    "strategy": "dp_fsdp_tp",
    "mesh": {"dp": 2, "fsdp": 2, "tp": 2},
    "model": "gpt",
    "optimizer": "adam",
    "steps": 3,
    "batch_size": 16,
    "gpt": {"vocab_size": 128, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 32, "moe": MOE},
    "launch": {"timeout_s": 300},
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_moe_under_hsdp_tp_matches_one_device(tmp_path, dtype):
    """The MoE GPT (the default config's sizes) under dp 2 × fsdp 2 × tp 2, Adam, 3 steps. In fp32 a
    fixed 1e-5 failed this cell: param error 1.53e-05 in transformer.h.0.mlp.experts.c_proj, where one
    fp32 device itself misses the fp64 run by 1.7e-5 (Adam's lr·Δg/eps on near-zero gradients); the
    tensor's tolerance is now twice that (parity.rounding_tolerances). fp64: 1e-12 absolute."""
    p = Plan.from_params({**MOE_3D, "dtype": dtype})
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert m["parity_ok"] == 1.0, m
    assert m["parity_err_worst"] <= m["parity_tol"] and m["parity_replica_spread"] == 0.0
    assert m["parity_max_dgrad"] <= p.tolerance and m["parity_max_dloss"] <= p.tolerance
    if dtype == "float32":  # the tolerance a fixed 1e-5 lacked, derived per tensor from the fp64 run
        assert all(set(r["over"]) == {"loss", "grad", "param"} for r in ranks)
        for worst in (r["over"]["param"] for r in ranks):  # never below the floor; above it wherever it must be
            assert p.tolerance <= worst["tol"] and worst["err"] <= worst["tol"], worst
            # where a tensor misses the fixed 1e-5 (the AVX2 EPYC: 1.53e-05), its tolerance came from the
            # fp64 run; a host whose fp32 device stays within half of 1e-5 (the AMX Xeon) keeps the floor
            assert worst["err"] <= p.tolerance or worst["tol"] > p.tolerance, worst
    else:
        assert m["parity_tol"] == 1e-12 and all("over" not in r or r["over"]["param"]["tol"] == 1e-12 for r in ranks)
    assert abs(m["state_ratio"] - 1) <= 0.01 and abs(m["dispatch_comm_ratio"] - 1) <= 0.01


@pytest.mark.slow
def test_fp32_tolerances_still_catch_small_bugs_in_the_moe_3d_cell(tmp_path):
    """The widened fp32 tolerance does not blind the check: in the same cell, rank 1's gradients 1 %
    too large before the last step, and rank 2's copy of the tensor with the widest tolerance
    (experts.c_proj, ~3.4e-5) off by 1e-4 after it, each fail it on their own kind."""
    fault = {"at_step": 2, "scale_grad_rank": 1, "scale_grad_by": 1.01}
    fault |= {"diverge_rank": 2, "diverge_param": "experts.c_proj", "diverge_by": 1e-4}
    p = Plan.from_params({**MOE_3D, "dtype": "float32", "fault": fault})
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert m["parity_ok"] == 0.0 and m["parity_err_over_tol"] > 1
    grad = max((r["over"]["grad"] for r in ranks), key=lambda o: o["ratio"])
    param = max((r["over"]["param"] for r in ranks), key=lambda o: o["ratio"])
    assert grad["ratio"] > 1 and grad["tol"] == p.tolerance, grad  # no gradient's tolerance was widened
    assert param["ratio"] > 1 and param["where"] == "transformer.h.0.mlp.experts.c_proj", param
    assert param["tol"] > p.tolerance and param["err"] >= 1e-4 - param["tol"]


def test_fp32_tolerance_is_twice_one_devices_own_rounding_per_tensor():
    """parity.rounding_tolerances: per tensor, max(floor, 2·|ref32 - ref64|max); the verdict takes each
    rank's worst share of its own tensor's tolerance, and a failure names that tolerance."""
    import torch

    from steps.sharding.parity import failure_message, over_tolerance, rounding_tolerances, verdict, worse

    ref32 = ([1.0], [{"w": torch.zeros(3), "b": torch.zeros(2)}], {"w": torch.zeros(3), "b": torch.zeros(2)})
    ref64 = (
        [1.0 + 2e-7],
        [{"w": torch.zeros(3), "b": torch.zeros(2)}],
        {"w": torch.tensor([0, 2e-5, 0]), "b": torch.zeros(2)},
    )
    tols = rounding_tolerances(ref32, ref64, 1e-5)
    assert tols["loss"] == [1e-5] and tols["grad"] == [{"w": 1e-5, "b": 1e-5}]
    assert tols["param"]["w"] == pytest.approx(4e-5) and tols["param"]["b"] == 1e-5
    # 3e-5 in w passes (3/4 of its tolerance), the same 3e-5 in b fails (3× its tolerance)
    sharded = {"w": torch.tensor([3e-5, 0, 0]), "b": torch.zeros(2)}
    ratio, err, tol, where = over_tolerance(sharded, ref32[2], tols["param"], 1e-5)
    assert (where, err) == ("w", pytest.approx(3e-5)) and ratio == pytest.approx(0.75) and tol == pytest.approx(4e-5)
    bad = over_tolerance({"w": torch.zeros(3), "b": torch.tensor([0, 3e-5])}, ref32[2], tols["param"], 1e-5)
    assert bad[3] == "b" and bad[0] == pytest.approx(3.0)
    rec = {"rank": 0, "dloss": [0.0], "dgrad": [0.0], "dparam": 3e-5, "replica_spread": 0.0}
    ok = verdict([{**rec, "over": {"param": worse(None, ratio, err, tol, where)}}], 1e-5)
    assert ok["parity_ok"] == 1.0 and ok["parity_err_over_tol"] == pytest.approx(0.75)
    assert verdict([rec], 1e-5)["parity_ok"] == 0.0  # the fixed 1e-5 of before: the false alarm
    v = verdict([{**rec, "rank": 1, "over": {"param": worse(None, *bad)}}], 1e-5)
    assert v["parity_ok"] == 0.0 and v["parity_worst_where"] == "b" and v["parity_tol"] == 1e-5
    assert failure_message(v).startswith("parity failed: param error 3.00e-05 > tolerance 1e-05 on rank 1 (b)")


def test_a_jax_cell_fails_on_the_torch_cross_check_alone():
    """A JAX cell whose sharded run matches its own one-device run but not torch's fails parity:
    the cross-backend error is a kind of the verdict, named with its tensor."""
    from steps.sharding.parity import verdict

    rec = {"rank": 0, "dloss": [0.0], "dgrad": [0.0], "dparam": 0.0, "replica_spread": 0.0}
    v = verdict([{**rec, "xb_err": 3e-5, "xb_where": "transformer.h.0.mlp.gate.weight"}], 1e-5)
    assert v["parity_ok"] == 0.0 and v["parity_worst_of"] == "xbackend" and v["parity_xbackend"] == 3e-5
    assert v["parity_worst_where"] == "transformer.h.0.mlp.gate.weight"
    assert "parity_xbackend" not in verdict([rec], 1e-5)  # a torch cell has no cross-check to report


# ---- parity that cannot hide ---------------------------------------------------------------------
def diverged(backend: str, **kw) -> Plan:
    """DP at world 2 whose rank (JAX: device) 1 adds 1e-3 to one parameter after the LAST step: its
    gradients stay right, and rank 0's own replica still matches one device."""
    extra = {"model": "gpt", "optimizer": "sgd"} if backend == "torch_native" else {}
    fault = {"diverge_rank": 1, "at_step": TINY["steps"] - 1, "diverge_by": 1e-3}
    return plan(backend=backend, strategy="dp", mesh={"dp": 2}, fault=fault, **extra, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch_native", "jax_jit"])
def test_a_diverged_replica_fails_parity(tmp_path, backend):
    """(torch_scratch: through the stage job, test_a_cell_that_fails_parity_ends_failed.)"""
    p = diverged(backend)
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert m["parity_ok"] == 0.0 and m["parity_worst_of"] in ("param", "replicas")
    assert m["parity_err_worst"] == pytest.approx(1e-3, rel=1e-3)
    assert m["parity_replica_spread"] == pytest.approx(1e-3, rel=1e-3)  # the replicas disagree
    assert m["parity_max_dgrad"] <= p.tolerance and m["parity_max_dloss"] <= p.tolerance
    if backend == "jax_jit":  # one process: the copy on device 1 is the one that drifted
        assert m["parity_worst_where"].endswith("@device 1"), m["parity_worst_where"]
    else:  # rank 0's replica alone passes: checking only rank 0 would have hidden the drift
        assert ranks[0]["dparam"] <= p.tolerance and m["parity_worst_rank"] == 1


@pytest.mark.slow
def test_a_cell_that_fails_parity_ends_failed(tmp_path):
    """The real stage job (torchrun underneath, a real SQLite MLflow store): a diverged scratch DP
    replica makes the job exit non-zero, its run FAILED with the reason, the numbers in its
    metrics and in parity.json, and the report reads the cell as failed with that reason."""
    import mlflow

    from steps.report.gather import load_cell
    from tests.conftest import run_stage

    params = {**diverged("torch_scratch").to_dict(), "job_threads": 1}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = run_stage(tmp_path, "sharding", params, cell="dp_diverged", common={"tracking": {"uri": uri}}, check=False)
    assert proc.returncode != 0
    assert "ParityError: cell dp_diverged: parity failed: param error 1.00e-03 > tolerance 1e-05 on rank 1" in (
        proc.stderr
    )
    out = tmp_path / "results/sharding/dp_diverged"
    failed = json.loads((out / "failed.json").read_text())
    assert failed["status"] == "failed" and "parity failed" in failed["error"]
    assert not (out / "metrics.json").exists()
    rec = json.loads((out / "parity.json").read_text())
    assert rec["metrics"]["parity_ok"] == 0.0 and rec["metrics"]["parity_worst_rank"] == 1.0
    assert rec["info"]["parity_worst_of"] == "param" and rec["info"]["parity"].startswith("FAIL 1.0e-03 param")
    run = mlflow.MlflowClient(uri).get_run(failed["run_id"])
    assert run.info.status == "FAILED" and "parity failed" in run.data.tags["error"]
    assert run.data.metrics["parity_ok"] == 0.0 and run.data.metrics["parity_err_worst"] == pytest.approx(1e-3, 1e-3)
    assert run.data.tags["parity_worst_of"] == "param"
    cell = load_cell(out / "metrics.json", "sharding", "dp_diverged")
    assert cell["status"] == "failed" and "parity failed: param error" in cell["reason"]


@pytest.mark.slow
def test_fp64_fsdp2_at_world_4_compares_an_fp64_loss(tmp_path):
    """A user's own cell: native FSDP2 on the GPT in float64 at world 4. Its loss used to come back
    from the model rounded to float32 (causal_lm_loss cast logits with .float()): |Δloss| 3.6e-7
    against the 1e-12 target while gradients agreed to 1e-17 (both sides rounded the same way)."""
    p = plan(backend="torch_native", strategy="fsdp", mesh={"fsdp": 4}, model="gpt", optimizer="sgd", dtype="float64")
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert len(ranks) == 4 and p.tolerance == 1e-12
    assert m["parity_max_dloss"] <= 1e-12, m["parity_max_dloss"]
    assert m["parity_err_worst"] <= 1e-12 and m["parity_ok"] == 1.0
    assert abs(m["state_ratio"] - 1) <= 0.01


def test_gpt_loss_keeps_the_models_precision():
    """The root of the fp64 loss gap: the GPT's loss is float64 in a float64 plan, the
    exact cross-entropy of its float64 logits; a float32 loss in a float64 plan stops the rank."""
    import torch

    from steps.sharding.gpt_init import full_model, gpt_batch
    from steps.sharding.worker import check_loss_dtype

    p = plan(backend="torch_native", strategy="fsdp", mesh={"fsdp": 2}, model="gpt", dtype="float64")
    ids = gpt_batch(p, 0)
    model = full_model(p, torch.float64)
    out = model(ids, labels=ids)
    assert out.loss.dtype == out.logits.dtype == torch.float64
    exact = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
    assert abs(out.loss.item() - exact.item()) <= 1e-14
    assert model(ids).loss is None and model(ids).logits.shape == (8, 8, 64)
    check_loss_dtype(out.loss, torch.float64)
    with pytest.raises(RuntimeError, match="float32 in a torch.float64 plan"):
        check_loss_dtype(out.loss.float(), torch.float64)


def test_parity_verdict_takes_the_worst_kind_over_every_rank():
    from steps.sharding.parity import failure_message, verdict

    ok = {"dloss": [1e-9, 2e-9], "dgrad": [3e-9, 1e-9], "dparam": 1e-9, "replica_spread": 0.0}
    bad = {**ok, "rank": 1, "dgrad": [3e-9, 4e-5], "dgrad_where": "1.w2"}
    v = verdict([{**ok, "rank": 0}, bad], 1e-5)
    assert (v["parity_worst_of"], v["parity_worst_rank"], v["parity_worst_where"]) == ("grad", 1, "1.w2")
    assert v["parity_err_worst"] == 4e-5 and v["parity_max_dloss"] == 2e-9 and v["parity_ok"] == 0.0
    assert failure_message(v).startswith("parity failed: grad error 4.00e-05 > tolerance 1e-05 on rank 1 (1.w2)")
    assert verdict([ok, ok], 1e-5)["parity_ok"] == 1.0
    v = verdict([ok, {**ok, "replica_spread": 2e-5, "replica_where": "0.b1"}], 1e-5)
    assert v["parity_worst_of"] == "replicas" and v["parity_ok"] == 0.0


def test_parity_compares_every_shard_of_a_replicated_array():
    """JAX holds a replicated array as one copy per device; reading it back (np.asarray) sees one
    copy. max_delta_shards checks each copy against the reference and against each other."""
    import types

    import numpy as np

    from steps.sharding.parity import max_delta_shards

    def shard(device, index, data):
        return types.SimpleNamespace(device=types.SimpleNamespace(id=device), index=index, data=np.asarray(data))

    ref = {"w": np.arange(4.0)}
    good = types.SimpleNamespace(addressable_shards=[shard(0, (slice(None),), ref["w"])] * 2)
    drift = types.SimpleNamespace(
        addressable_shards=[shard(0, (slice(None),), ref["w"]), shard(1, (slice(None),), ref["w"] + [0, 0, 1e-3, 0])]
    )
    halves = types.SimpleNamespace(
        addressable_shards=[shard(0, (slice(0, 2),), [0.0, 1.0]), shard(1, (slice(2, 4),), [2.0, 3.0])]
    )
    assert max_delta_shards({"w": good}, ref) == (0.0, "w@device 0", (0.0, "w@device 0"))
    err, where, (spread, spread_where) = max_delta_shards({"w": drift}, ref)
    assert (where, spread_where) == ("w@device 1", "w@device 1") and err == spread == pytest.approx(1e-3)
    assert max_delta_shards({"w": halves}, ref) == (0.0, "w@device 0", (0.0, "w@device 0"))  # sharded: no copies


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_a_dead_or_hung_rank_fails_fast(tmp_path, mode):
    timeout = 20
    p = plan(
        strategy="dp",
        mesh={"dp": 2},
        steps=3,
        fault={"kill_rank": 1, "at_step": 1, "mode": mode},
        launch={"timeout_s": timeout},
    )
    t0 = time.time()
    # a rank that exits: torchrun reports its exit code; a hung one: our timeout, or gloo's in its peer
    with pytest.raises(LaunchError, match="exit code" if mode == "exit" else "exit code|timed out"):
        launch(p, tmp_path)
    assert time.time() - t0 < timeout + 10
    # no rank outlives the failed launch (torchrun gives each rank a session of its own)
    alive = processes_naming(tmp_path)
    assert not alive, f"ranks left running: {alive}"


@pytest.mark.slow
def test_stage_logs_one_mlflow_run_per_cell(tmp_path):
    """The real stage module: torchrun underneath, one MLflow run (sqlite in tmp) for the cell."""
    cfg = {
        "stage": "sharding",
        "cell": "t",
        "common": {"seed": 1, "device": "cpu", "threads": 1, "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"}},
        "params": {**TINY, "backend": "torch_scratch", "strategy": "tp", "mesh": {"tp": 2}},
    }
    out = tmp_path / "results/sharding/t"
    proc = run_module(tmp_path, "steps.sharding", ["--out", str(out), "--cfg", json.dumps(cfg)], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads((out / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["metrics"]["parity_ok"] == 1.0
    assert rec["metrics"]["parity_err_worst"] <= 1e-5 and rec["info"]["parity_worst_of"] in ("loss", "grad", "param")
    assert rec["info"]["notes"].endswith("2 ranks on 1 reserved core(s): tokens/s not timing-grade")
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("n00bgpt/sharding")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].data.metrics["dispatch_comm_ratio"] == pytest.approx(1.0)
    assert (out / "memory_comm.png").exists() and (out / "per_rank.csv").exists()


def test_jax_branching_lesson_counts_compilations():
    from steps.sharding.jax.lessons import branching

    r = branching()
    assert r["python_if_under_jit_fails"] == 1  # bool() of a tracer
    assert r["static_branch_compiles"] == 2  # one compile per static value (True, False)
    assert r["lax_cond_compiles"] == 1 and r["cond_matches_python"] == 1.0


# ---- where a cell runs: GPUs counted before anything starts (no GPU needed: counts are patched) ---
def test_torch_cell_needs_one_gpu_per_local_rank():
    from steps.sharding.launch import NotEnoughGPUs, torch_backend

    dp2 = plan(strategy="dp", mesh={"dp": 2})
    assert torch_backend(dp2, "cpu", 0) == "gloo"
    assert torch_backend(dp2, "cpu", 8) == "gloo"  # device cpu stays on the CPU
    assert torch_backend(dp2, "cuda", 2) == "nccl"
    assert torch_backend(dp2, "auto", 2) == "nccl"
    assert torch_backend(dp2, "auto", 1) == "gloo"  # auto: too few GPUs -> CPU
    with pytest.raises(NotEnoughGPUs, match=r"^skipped: needs 2 GPUs, found 1 "):
        torch_backend(dp2, "cuda", 1)  # the one-GPU workstation
    with pytest.raises(NotEnoughGPUs, match=r"^skipped: needs 2 GPUs, found 0 "):
        torch_backend(dp2, "cuda", 0)
    with pytest.raises(NotEnoughGPUs, match=r"^skipped: needs 4 GPUs, found 2 "):
        torch_backend(plan(strategy="dp_tp", mesh={"dp": 2, "tp": 2}), "cuda", 2)
    nccl = plan(strategy="dp", mesh={"dp": 2}, launch={"dist_backend": "nccl"})
    with pytest.raises(NotEnoughGPUs, match="needs 2 GPUs, found 1 .*dist_backend gloo and device auto"):
        torch_backend(nccl, "auto", 1)  # NCCL is GPU-only whatever device says
    with pytest.raises(NotEnoughGPUs, match=r"^skipped: needs 1 GPU, found 0 "):
        torch_backend(plan(strategy="single", mesh={}), "cuda", 0)
    two_nodes = plan(strategy="dp", mesh={"dp": 4}, launch={"nnodes": 2, "rdzv_endpoint": "h:1"})
    assert torch_backend(two_nodes, "cuda", 2) == "nccl"  # 2 local ranks per node


def test_jax_env_uses_the_gpus_only_when_jax_can_have_enough():
    from steps.sharding.launch import NotEnoughGPUs, jax_env

    p = plan(backend="jax_jit", strategy="dp_tp", mesh={"dp": 2, "tp": 2})
    host = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    assert jax_env(p, "cpu", 8, True) == host
    gpu = jax_env(p, "cuda", 4, True)
    assert gpu["JAX_PLATFORMS"] == "cuda" and "XLA_FLAGS" not in gpu
    assert jax_env(p, "auto", 8, True)["JAX_PLATFORMS"] == "cuda"
    assert jax_env(p, "auto", 2, True) == host  # auto: falls back to host devices
    assert jax_env(p, "auto", 4, False) == host  # no CUDA plugin in this jax
    with pytest.raises(NotEnoughGPUs, match=r"^skipped: needs 4 GPUs, found 2 "):
        jax_env(p, "cuda", 2, True)
    with pytest.raises(NotEnoughGPUs, match=r"^skipped: needs 4 GPUs, found 0 .*torch sees 4.*no CUDA plugin"):
        jax_env(p, "cuda", 4, False)
    lessons = plan(backend="jax_lessons", strategy="single", mesh={"devices": 4})
    with pytest.raises(NotEnoughGPUs, match="needs 4 GPUs, found 1"):
        jax_env(lessons, "cuda", 1, True)


def _stage_ctx(tmp_path, device: str, **params):
    from steps.core import StageRun

    return StageRun(
        "sharding",
        "t",
        {**TINY, **params},
        {"seed": 1, "device": device, "threads": 1},
        tmp_path,
    )


class _Launched(Exception):
    pass


def _patch_gpus(monkeypatch, n: int, jax_cuda: bool = True) -> list:
    """torch sees n GPUs; launch records (plan, env) and stops before starting any process."""
    import torch

    from steps.sharding import launch as L

    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(L, "jax_has_cuda", lambda: jax_cuda, raising=False)
    calls = []

    def fake_launch(p, out, env=None):
        calls.append((p, env))
        raise _Launched

    monkeypatch.setattr(L, "launch", fake_launch)
    return calls


@pytest.mark.parametrize(
    "backend,strategy,mesh",
    [("torch_scratch", "dp", {"dp": 2}), ("torch_native", "pp", {"pp": 2}), ("jax_shard_map", "tp", {"tp": 2})],
)
def test_stage_skips_a_cell_with_more_ranks_than_gpus(tmp_path, monkeypatch, backend, strategy, mesh):
    """The workstation profile: device cuda, one GPU. A 2-device cell is skipped with the count,
    before any process starts (NCCL would crash on two ranks per GPU, JAX on a too-small mesh)."""
    from steps.core import SkipCell
    from steps.sharding.stage import run

    calls = _patch_gpus(monkeypatch, 1)
    with pytest.raises(SkipCell, match=r"^skipped: needs 2 GPUs, found 1 "):
        run(_stage_ctx(tmp_path, "cuda", backend=backend, strategy=strategy, mesh=mesh, model="gpt"))
    assert calls == []


def test_stage_runs_a_cell_that_fits_on_the_gpus(tmp_path, monkeypatch):
    from steps.sharding.stage import run

    calls = _patch_gpus(monkeypatch, 2)
    with pytest.raises(_Launched):
        run(_stage_ctx(tmp_path, "cuda", backend="torch_scratch", strategy="dp", mesh={"dp": 2}))
    with pytest.raises(_Launched):
        run(_stage_ctx(tmp_path, "cuda", backend="jax_jit", strategy="dp", mesh={"dp": 2}))
    (torch_plan, torch_env), (jax_plan, env) = calls
    assert torch_plan.launch.dist_backend == "nccl" and torch_env is None
    assert env["JAX_PLATFORMS"] == "cuda"
    calls.clear()
    _patch_gpus(monkeypatch, 1)  # device auto on one GPU: both run on the CPU instead of skipping
    for backend in ("torch_scratch", "jax_jit"):
        with pytest.raises(_Launched):
            run(_stage_ctx(tmp_path, "auto", backend=backend, strategy="dp", mesh={"dp": 2}))


def test_stage_rejects_a_strategy_its_backend_has_no_engine_for(tmp_path, monkeypatch):
    """The engine registry answers before any process starts (it used to be a crash in every rank)."""
    from steps.core import InputError
    from steps.sharding.stage import run

    calls = _patch_gpus(monkeypatch, 0)
    with pytest.raises(
        InputError, match=r"torch_scratch has no engine for strategy 'fsdp_tp'.*use backend torch_native"
    ):
        run(_stage_ctx(tmp_path, "cpu", backend="torch_scratch", strategy="fsdp_tp", mesh={"fsdp": 2, "tp": 2}))
    with pytest.raises(PlanError, match="jax_jit has no engine for strategy 'pp'"):
        launch(plan(backend="jax_jit", strategy="pp", mesh={"pp": 2}), tmp_path)
    assert calls == []


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="proves the no-CUDA message")
def test_stage_without_cuda_records_how_many_gpus_the_cell_needs(tmp_path):
    """Through the stage module (subprocess): device cuda on a machine without CUDA says
    "needs 2 GPUs, found 0", not only "no CUDA", and the cell is recorded as skipped."""
    from tests.conftest import run_stage

    run_stage(
        tmp_path,
        "sharding",
        {**TINY, "backend": "torch_scratch", "strategy": "dp", "mesh": {"dp": 2}},
        cell="dp2",
        common={"device": "cuda", "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"}},
    )
    rec = json.loads((tmp_path / "results/sharding/dp2/metrics.json").read_text())
    assert rec["status"] == "skipped" and rec["reason"].startswith("skipped: needs 2 GPUs, found 0 ")


# ---- pipeline state gathered for the parity check travels on the CPU ------------------------------
@pytest.fixture
def gloo_world_of_one(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _record_gathers(monkeypatch) -> list:
    """all_gather_object in a world of one, recording the device of every tensor it is handed
    (a pickled tensor is rebuilt on that device in every receiving rank)."""
    import torch.distributed as dist

    sent = []

    def record(parts, obj, group=None):
        sent.append({k: v.device.type for k, v in obj.items()})
        parts[0] = obj

    monkeypatch.setattr(dist, "all_gather_object", record)
    return sent


def test_pipeline_stages_are_gathered_on_the_cpu(gloo_world_of_one, monkeypatch):
    """Fake CUDA tensors (FakeTensorMode needs no GPU) stand for a stage on its rank's GPU."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from steps.sharding.native.engine import PipelineEngine
    from steps.sharding.scratch.pp import PipelineMLP
    from steps.sharding.toy_mlp_init import init_mlp

    sent = _record_gathers(monkeypatch)
    with FakeTensorMode(allow_non_fake_inputs=True):
        full = {k: torch.empty(v.shape, device="cuda") for k, v in init_mlp(dim=4, hidden=8, layers=2, seed=0).items()}
        scratch = PipelineMLP(full).full_state("param")
        native = PipelineEngine.__new__(PipelineEngine)  # only what full_state reads
        native.plan, native.world = plan(backend="torch_native", strategy="pp", mesh={"pp": 2}), 1
        native.ref_model = torch.nn.ParameterDict(
            {"weight": torch.empty(3, 4, device="cuda"), "bias": torch.empty(3, device="cuda")}
        )
        native.stage_names = ["weight", "bias"]
        gathered = native.full_state("param")
    assert sent == [{k: "cpu" for k in full}, {"weight": "cpu", "bias": "cpu"}]
    assert {v.device.type for v in [*scratch.values(), *gathered.values()]} == {"cpu"}
    assert set(scratch) == set(full) and scratch["0.w1"].shape == (8, 4)


def test_parity_compares_a_cpu_state_with_a_gpu_reference():
    """The gathered pipeline state (CPU) against rank 0's reference (its GPU under NCCL)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from steps.sharding.parity import abs_diff

    with FakeTensorMode(allow_non_fake_inputs=True):
        d = abs_diff(torch.zeros(3, 2), torch.ones(3, 2, device="cuda"))
    assert d.device.type == "cpu" and d.dtype == torch.float64 and d.shape == (3, 2)
    assert float(abs_diff(torch.zeros(2), torch.tensor([1.0, -3.0])).max()) == 3.0


@pytest.mark.parametrize("on_gpu", [True, False], ids=["cuda", "cpu"])
def test_rank_step_time_includes_the_gpus_queued_work(gloo_world_of_one, monkeypatch, tmp_path, on_gpu):
    """A rank's step_s (tokens/s) under NCCL: the clock is read after the GPU has finished the
    step's kernels and collectives. The GPU is modelled: synchronize() takes 0.25 s of clock."""
    import types

    import torch

    from steps.sharding import worker

    clock = types.SimpleNamespace(t=0.0, syncs=0)

    def synchronize(device=None):
        if not on_gpu:
            raise AssertionError("synchronize() on a CPU rank")
        clock.t += 0.25
        clock.syncs += 1

    monkeypatch.setattr(worker, "time", types.SimpleNamespace(perf_counter=lambda: clock.t))
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    if on_gpu:  # what main() sets under NCCL (the tensors stay on the CPU here)
        monkeypatch.setattr(torch, "get_default_device", lambda: torch.device("cuda", 0))
    rec = worker.run(plan(strategy="dp", mesh={"dp": 1}, steps=2), tmp_path)
    assert rec["step_s"] == ([0.25, 0.25] if on_gpu else [0.0, 0.0])
    assert clock.syncs == (4 if on_gpu else 0) and rec["dparam"] <= 1e-6


def test_jax_lesson_jit_speedup_is_measured_side_by_side():
    """jit vs eager on the same loss and batch: A B / B A pairs in one process (steps/paired.py),
    the ratio with its interval; one fused XLA program beats op-by-op dispatch beyond noise."""
    from steps.paired import MIN_PAIRS
    from steps.sharding.jax.lessons import jit_speedup

    m = jit_speedup(plan(backend="jax_lessons", strategy="single", mesh={"devices": 1}))
    assert m["jit_speedup_pairs"] == MIN_PAIRS
    assert m["jit_speedup_low"] > 1  # its 95 % interval lies above 1
    assert m["eager_step_s"] > m["jit_step_s"]


# ---- PP combined with DP, TP and FSDP (#50 2): world 4, the GPT, every rank against one device --------
PP_MESH = [
    ("pp_dp", {"pp": 2, "dp": 2}, {"dtype": "float64", "schedule": "1f1b"}),
    ("pp_tp", {"pp": 2, "tp": 2}, {}),
    ("pp_fsdp", {"pp": 2, "fsdp": 2}, {"dtype": "float64"}),
]


def pp_mesh_plan(strategy: str, mesh: dict, **kw) -> Plan:
    """batch 8 over 2 data ranks in 2 microbatches: 2 sequences a microbatch (pp_tp: 4)."""
    kw = {"microbatches": 2, **kw}
    return plan(backend="torch_native", strategy=strategy, mesh=mesh, model="gpt", optimizer="sgd", **kw)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,mesh,extra", PP_MESH, ids=[c[0] for c in PP_MESH])
def test_pipeline_combined_matches_single_device(tmp_path, strategy, mesh, extra):
    """Stages first, then TP / FSDP2 / replication on each (native/pp_mesh.py). The dispatched bytes
    match the analytic model only because the stages are given their shapes: pipelining's first-step
    shape inference ran an extra forward, which charged pp_tp 1.15× and pp_fsdp 1.23× the model."""
    p = pp_mesh_plan(strategy, mesh, **extra)
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert_matches_single_device(p, ranks, m)
    # the pipeline's sends on the pp axis (each rank's peer resolved): activations forward, gradients
    # backward, for its pipeline's rows; beside them only the reported loss's broadcast over pp
    g, rows = p.gpt, p.batch_size // p.data_size
    pipe = 2 * (p.axis("pp") - 1) * rows * g["block_size"] * g["n_embd"] * p.bytes_per_elem / p.axis("pp")
    assert m["dispatch_comm_bytes_step_pp"] == pytest.approx(pipe, rel=1e-2)
    # the stages hold different parameters (embeddings vs final norm + head): each rank its own stage's
    first, last = ranks[0]["analytic"]["state_bytes"], ranks[-1]["analytic"]["state_bytes"]
    assert first != last and all(sum(r["state_bytes"].values()) == r["analytic"]["state_bytes"] for r in ranks)


@pytest.mark.slow
def test_a_diverged_pipeline_replica_fails_parity(tmp_path):
    """pp_dp (mesh pp-outer: ranks 0, 1 hold stage 0 of replicas 0, 1; ranks 2, 3 stage 1): rank 3
    drifts after the last step. Each rank's view is its own pipeline's, gathered over its pp group
    only, so replica 1 (ranks 1 and 3) fails and replica 0 (ranks 0 and 2) passes; a view merged over
    the whole world would have kept one replica's copy of each stage for every rank."""
    fault = {"diverge_rank": 3, "at_step": TINY["steps"] - 1, "diverge_by": 1e-3}
    p = pp_mesh_plan("pp_dp", {"pp": 2, "dp": 2}, dtype="float64", fault=fault)
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert m["parity_ok"] == 0.0 and m["parity_worst_rank"] in (1, 3)
    assert [r["dparam"] == pytest.approx(1e-3, rel=1e-3) for r in ranks] == [False, True, False, True]
    assert ranks[0]["dparam"] <= p.tolerance and ranks[2]["dparam"] <= p.tolerance
    assert m["parity_replica_spread"] == pytest.approx(1e-3, rel=1e-3)
    assert m["parity_max_dgrad"] <= p.tolerance and m["parity_max_dloss"] <= p.tolerance


def test_pipeline_combined_plans_check_the_pipelines_rows():
    """Each data rank's rows go through its own pipeline: they, not the global batch, split into microbatches."""
    with pytest.raises(PlanError, match="microbatches"):
        pp_mesh_plan("pp_dp", {"pp": 2, "dp": 2}, batch_size=4, microbatches=4)  # 2 rows a data rank
    with pytest.raises(PlanError, match="sequence_parallel"):
        pp_mesh_plan("pp_tp", {"pp": 2, "tp": 2}, sequence_parallel=True)
    assert pp_mesh_plan("pp_fsdp", {"pp": 2, "fsdp": 2}).pipeline_bubble() == 1 / 3  # (S-1)/(M+S-1)


def test_a_teardown_hang_after_every_record_keeps_the_launch(tmp_path, monkeypatch):
    """Processes that wrote every rank's record and then hang (gloo's teardown, seen in CI) are killed
    after EXIT_GRACE_S and the launch stands; the same hang before the records is a failed launch."""
    import sys as _sys

    from steps.sharding import processes

    monkeypatch.setattr(processes, "EXIT_GRACE_S", 1.0)
    script = (
        "import pathlib, sys, time\n"
        "for r in (0, 1): pathlib.Path(sys.argv[1], f'rank{r}.json').write_text('{}')\n"
        "time.sleep(300)"
    )
    cmd = [_sys.executable, "-c", script, str(tmp_path)]
    t0 = time.time()
    processes.run_processes(cmd, tmp_path, 120, done=processes.records_written(tmp_path, 2))
    assert time.time() - t0 < 30
    quiet = [_sys.executable, "-c", "import time; time.sleep(300)"]
    with pytest.raises(processes.LaunchError, match="a rank hung"):
        processes.run_processes(quiet, tmp_path, 3, done=processes.records_written(tmp_path, 2))
