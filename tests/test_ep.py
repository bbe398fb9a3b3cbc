"""Expert parallelism (strategy ep) on the MoE GPT: from scratch and native at world 4 (gloo) against
one device, state and all-to-all bytes against the analytic model, and a diverged expert on one
rank failing the cell."""

import json

import pytest
import torch

from steps.analytic.comm import gpt_comm
from steps.analytic.costs import gpt_costs
from steps.config import cell_config, cells, load_config
from steps.sharding.launch import launch
from steps.sharding.plan import STRATEGY_AXES, Plan, PlanError
from steps.sharding.stage import summarize
from tests.conftest import DEFAULT, FULL, SMOKE

MOE_GPT = {"vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16}
MOE = {"experts": 8, "top_k": 2, "aux_loss_coef": 0.02}


def ep_plan(backend="torch_scratch", ep=4, moe=MOE, mesh=None, **kw) -> Plan:
    return Plan.from_params(
        {
            "backend": backend,
            "strategy": "fsdp_ep" if mesh and "fsdp" in mesh else "ep",
            "mesh": mesh or {"ep": ep},
            "model": "gpt",
            "optimizer": "sgd",
            "dtype": "float64",
            "batch_size": 8,
            "steps": 2,
            "gpt": {**MOE_GPT, "moe": moe},
            "launch": {"timeout_s": 120},
            **kw,
        }
    )


def test_ep_plan_rejects_what_it_cannot_run():
    with pytest.raises(PlanError, match="needs model: gpt with gpt.moe"):
        Plan.from_params({"strategy": "ep", "mesh": {"ep": 2}})
    with pytest.raises(PlanError, match="must divide by ep=3"):
        ep_plan(ep=3, batch_size=6)
    with pytest.raises(PlanError, match="capacity_factor: null"):
        ep_plan(moe={**MOE, "capacity_factor": 1.25})


def test_ep_analytic_by_hand():
    """ep=4, fp64, 8 sequences of 8 tokens, C=16, E=8 GELU experts of 64, top-2, 2 layers.
    Experts 2 · 8 · 2 · 64 · 16 = 32768 parameters of 36512; dense 3744."""
    p = ep_plan()
    from steps.sharding.gpt_init import full_model, param_shapes

    shapes = param_shapes(full_model(p, torch.float64))
    assert sum(shapes.values()) == 36512 and sum(n for k, n in shapes.items() if ".experts." in k) == 32768
    dense_ar = 2 * 3 / 4 * 3744 * 8  # DP's all-reduce of the dense gradients
    a2a = 4 * 3 / 4 * (2 * 8 * 2) * 16 * 8  # dispatch + combine, fwd + bwd: 2 seqs · 8 tokens · k=2 rows of 16
    counts = 3 / 4 * 8 * 8  # the E int64 row counts
    aux = 2 * (2 * 3 / 4 * 2 * 8 * 8)  # 2E statistics, forward and backward
    assert gpt_comm(p, shapes) == dense_ar + 2 * (a2a + counts + aux) == 70368
    assert gpt_costs(p, shapes)["state_bytes"] == 3 * (3744 + 32768 / 4) * 8


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch_scratch", "torch_native"])
def test_ep_at_world_4_matches_one_device(tmp_path, backend):
    p = ep_plan(backend)
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert len(ranks) == 4 and p.tolerance == 1e-12
    assert m["parity_ok"] == 1.0 and m["parity_err_worst"] <= 1e-12, m
    assert all(len(r["dgrad"]) == 2 for r in ranks)
    assert abs(m["state_ratio"] - 1) <= 1e-9  # each rank: dense + E/4 experts, params + grads + momentum
    assert all(r["comm_calls"]["all_to_all"] == 2 * (4 + 1) for r in ranks)  # per layer: 4 rows + 1 counts
    # the mean over ranks is exact; native DDP adds its rebuilt-bucket broadcast once (docs/sharding.md)
    ratio = m["dispatch_comm_ratio"]
    assert abs(ratio - 1) <= (1e-12 if backend == "torch_scratch" else 0.01), ratio
    bytes_a2a = [r["comm_detail"]["all_to_all/4"] for r in ranks]
    assert len(set(bytes_a2a)) > 1  # uneven routing: the ranks' all-to-all bytes differ, the mean does not


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_ep_inside_fsdp2_matches_one_device(tmp_path, dtype, tol):
    """{fsdp: 2, ep: 2}: dense parameters FSDP2 over 4 ranks, each rank's 4 experts FSDP2 over fsdp
    (fp32 too: its reduce-scatter with a divide factor must not ask gloo for PREMUL_SUM)."""
    p = ep_plan("torch_native", mesh={"fsdp": 2, "ep": 2}, dtype=dtype)
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert m["parity_ok"] == 1.0 and m["parity_err_worst"] <= tol, m
    assert abs(m["state_ratio"] - 1) <= 1e-9 and abs(m["dispatch_comm_ratio"] - 1) <= 1e-9
    assert m["state_bytes_analytic"] == 3 * (36512 / 4) * (8 if dtype == "float64" else 4)  # all sharded 4 ways
    assert {"all_gather", "reduce_scatter", "all_to_all", "all_reduce"} <= set(ranks[0]["comm_calls"])


@pytest.mark.slow
def test_a_diverged_expert_on_one_rank_fails_the_cell(tmp_path):
    """Rank 2 nudges one of its own experts after the last step: only it holds that expert, so the
    gathered parameters differ from one device on every rank, at that expert."""
    fault = {"diverge_rank": 2, "at_step": 1, "diverge_by": 1e-3, "diverge_param": "experts"}
    p = ep_plan(fault=fault)
    m = summarize(p, launch(p, tmp_path))
    assert m["parity_ok"] == 0.0 and m["parity_worst_of"] == "param"
    assert m["parity_err_worst"] == pytest.approx(1e-3, rel=1e-6)
    assert ".mlp.experts." in m["parity_worst_where"]
    assert m["parity_max_dgrad"] <= 1e-12 and m["parity_max_dloss"] <= 1e-12


@pytest.mark.slow
def test_jax_shard_map_ep_matches_one_device(tmp_path):
    """GShard's dense dispatch under shard_map: 4 host devices, fp64, against the same function on one
    and against the torch MoE (steps/models/moe.py, ragged dispatch) on one device, same weights."""
    p = ep_plan("jax_shard_map")
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert m["parity_ok"] == 1.0 and m["parity_err_worst"] <= 1e-12, m
    assert 0 < m["parity_xbackend"] <= 1e-12 and m["xbackend_max_dparam"] <= 1e-12  # torch's MoE decides too
    assert ranks[0]["comm_calls"]["all-to-all"] == 4 * 2 - 1  # the first dispatch's transpose is dead code
    assert abs(m["dispatch_comm_ratio"] - 1) <= 1e-12 and abs(m["state_ratio"] - 1) <= 1e-12


@pytest.mark.parametrize("configfile", [DEFAULT, SMOKE, FULL], ids=["default", "smoke", "full"])
def test_every_sharding_cell_plans_from_its_jobs_sorted_json(configfile):
    """A job's cfg reaches it as JSON with sorted keys (rules/common.smk): a mesh like {fsdp: 2, ep: 2}
    arrives as {ep, fsdp}; the plan must still come out in the strategy's order (outer axis first)."""
    cfg = load_config(DEFAULT, configfile)
    for cell in cells(cfg, "sharding"):
        params = json.loads(json.dumps(cell_config(cfg, "sharding", cell)["params"], sort_keys=True))
        plan = Plan.from_params(params)
        assert tuple(plan.mesh) == STRATEGY_AXES[plan.strategy] or plan.backend == "jax_lessons", (cell, plan.mesh)
