"""ZeRO-1 and ZeRO-2 from scratch (steps/sharding/scratch/zero1.py, zero2.py) beside FSDP (= ZeRO-3,
scratch/fsdp.py): each as real gloo processes against one device on every rank, and each rank's
params, gradient and optimizer-state bytes against the analytic model's (steps/analytic/costs.py)."""

import pytest

from steps.sharding.launch import launch
from steps.sharding.plan import Plan
from steps.sharding.summary import summarize
from tests.conftest import assert_matches_single_device

TINY = {"mlp": {"dim": 8, "hidden": 16, "layers": 2}, "batch_size": 8, "steps": 2, "launch": {"timeout_s": 90}}
# one device's bytes of each part (params, grads, Adam's two moments) that a rank keeps, ZeRO stage by stage
KEEPS = {"zero1": (1, 1, 1 / 2), "zero2": (1, 1 / 2, 1 / 2), "fsdp": (1 / 2, 1 / 2, 1 / 2)}


def zero_plan(strategy: str, n: int = 2, **kw) -> Plan:
    axis = "fsdp" if strategy == "fsdp" else "dp"
    return Plan.from_params({**TINY, "backend": "torch_scratch", "strategy": strategy, "mesh": {axis: n}, **kw})


@pytest.mark.slow
def test_zero_stages_side_by_side_match_one_device_and_keep_1_over_n(tmp_path):
    """ZeRO-1, ZeRO-2 and ZeRO-3 (FSDP) at world 2, fp32 Adam: parity on every rank, and on every rank
    the measured bytes of each part equal the analytic model's, which keeps 1/N of the optimizer state
    (ZeRO-1), of the gradients too (ZeRO-2), of everything (ZeRO-3)."""
    psi = 2 * (2 * 8 * 16 + 16 + 8)  # the MLP's parameters
    for strategy, keeps in KEEPS.items():
        p = zero_plan(strategy)
        ranks = launch(p, tmp_path / strategy)
        m = summarize(p, ranks)
        assert_matches_single_device(p, ranks, m)
        for r in ranks:  # to the byte, every rank
            assert r["state_bytes"] == pytest.approx(r["analytic"]["state_parts"], rel=0, abs=0), strategy
            assert r["state_bytes"]["optim"] == 2 * psi * 4 * keeps[2]
        measured = tuple(m[f"state_{k}_of_one_device"] for k in ("params", "grads", "optim"))
        assert measured == keeps, (strategy, measured)
        assert all(m[f"state_{k}_ratio"] == 1.0 for k in ("params", "grads", "optim"))
        assert m["dispatch_comm_ratio"] == pytest.approx(1.0)  # 2Ψ(N-1)/N (ZeRO-1/2) and 3Ψ(N-1)/N (ZeRO-3)
        calls = ranks[0]["comm_calls"]
        if strategy != "fsdp":  # one reduce-scatter and one all-gather per block per step, no all-reduce
            assert calls == {"reduce_scatter": 2, "all_gather": 2}, calls


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero_at_world_4_in_fp64(tmp_path, strategy):
    p = zero_plan(strategy, 4, dtype="float64", steps=3)
    ranks = launch(p, tmp_path)
    m = summarize(p, ranks)
    assert_matches_single_device(p, ranks, m)
    assert m["parity_err_worst"] <= 1e-12 and m["state_optim_of_one_device"] == 1 / 4
    assert m["state_grads_of_one_device"] == (1 / 4 if strategy == "zero2" else 1)


@pytest.mark.slow
def test_a_wrong_gradient_scaling_on_one_zero2_rank_fails_parity(tmp_path):
    """Rank 1's gradient slices 1 % too large before the last step: its slice of the update is wrong."""
    fault = {"scale_grad_rank": 1, "scale_grad_by": 1.01, "at_step": 1}
    p = zero_plan("zero2", fault=fault)
    m = summarize(p, launch(p, tmp_path))
    assert m["parity_ok"] == 0.0 and m["parity_worst_of"] in ("grad", "param"), m
