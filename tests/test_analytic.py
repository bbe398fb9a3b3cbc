"""The analytic package (steps/analytic/) on its own: its formulas by hand on toy plans, the helpers
the sharding and scale models share giving what each wrote inline before, and that it imports
neither torch nor JAX (the launching sides and the scale stage's analytic cells rely on it)."""

import subprocess
import sys

import pytest

from steps.analytic import comm as C
from steps.analytic import params as P
from steps.analytic.flops import flops_per_token
from steps.models.shapes import Shape
from steps.scale.scale_plan import ScalePlan
from steps.sharding.plan import Plan
from tests.conftest import ROOT, clean_env


# ---- the sharding stage's model, by hand on a toy MLP: d=4, h=8, L=2 -> Ψ = 2·(2·4·8 + 8 + 4) = 152 ----------
def toy(**kw):
    return Plan.from_params({"mlp": {"dim": 4, "hidden": 8, "layers": 2}, "batch_size": 8, **kw})


def test_analytic_formulas_on_toy_mlp():
    assert P.mlp_psi(toy()) == 152
    assert C.mlp_comm(toy(strategy="dp", mesh={"dp": 2})) == 2 * (1 / 2) * 152 * 4  # 2Ψ(N-1)/N·b
    assert C.mlp_comm(toy(strategy="fsdp", mesh={"fsdp": 2})) == 3 * (1 / 2) * 152 * 4  # 3Ψ(N-1)/N·b
    assert C.mlp_comm(toy(strategy="tp", mesh={"tp": 2})) == 3 * 2 * (1 / 2) * 8 * 4 * 4  # (2L-1) AR of B·d
    assert C.mlp_comm(toy(strategy="pp", mesh={"pp": 2})) == 2 * 8 * 4 * 4 / 2  # acts + grads
    assert P.mlp_local_params(toy(strategy="tp", mesh={"tp": 2})) == 2 * ((64 + 8) / 2 + 4)  # b2 replicated
    assert P.mlp_local_params(toy(strategy="fsdp", mesh={"fsdp": 2})) == 76
    p = toy(strategy="dp_tp", mesh={"dp": 2, "tp": 2})  # TP on B/2 rows + DP over the TP shard
    assert C.mlp_comm(p) == 3 * 2 * (1 / 2) * 4 * 4 * 4 + 2 * (1 / 2) * 80 * 4
    # HSDP × TP: the dp replicas all-reduce the fsdp-reduce-scattered shard, Ψ_tp / fsdp
    gpt = {"vocab_size": 16, "block_size": 4, "n_layer": 1, "n_head": 2, "n_embd": 4}
    hsdp = Plan.from_params(
        {"strategy": "dp_fsdp_tp", "mesh": {"dp": 2, "fsdp": 2, "tp": 2}, "model": "gpt", "gpt": gpt}
    )
    no_dp = Plan.from_params({"strategy": "fsdp_tp", "mesh": {"fsdp": 2, "tp": 2}, "model": "gpt", "gpt": gpt})
    shapes = {"transformer.wte.weight": 64, "transformer.h.0.mlp.c_fc.weight": 64}  # replicated 64, tp-sharded 32
    assert hsdp.data_size == 4 and no_dp.data_size == 2  # rows per rank: 16/4 = 4 sequences vs 8
    tp = 4 * (2 * 1 / 2) * 4 * 4 * 4 * 4  # 4 all-reduces of (rows 4 · T 4 · C 4) fp32 over tp=2
    fsdp = (3 * 96 - 64) * (1 / 2) * 4  # 3Ψ_tp gathered/scattered over fsdp=2, the root (wte) twice
    dp = 2 * (1 / 2) * (96 / 2) * 4  # all-reduce over dp=2 of the fsdp shard
    assert C.gpt_comm(hsdp, shapes) == tp + fsdp + dp == 1664
    assert C.gpt_comm(no_dp, shapes) == 2 * tp + fsdp
    assert toy(strategy="dp", mesh={"dp": 2}).state_tensors * 152 * 4 == 2432  # Adam: 4Ψ·b
    assert toy(strategy="pp", mesh={"pp": 2}, microbatches=4).pipeline_bubble() == pytest.approx(1 / 5)


def test_ring_factors_and_the_shared_collective_patterns():
    """The ring convention, and the patterns both plan models use: FSDP's 3Ψ less the root's Ψ_root
    (one dtype: fsdp_bytes; mixed precision: its gather and scatter apart) and EP's all-to-alls."""
    assert C.ring_all_reduce(100.0, 4) == 150.0 and C.ring_gather(100.0, 4) == 75.0
    assert C.ring_bytes("send", 100.0, 4) == 100.0 and C.ring_bytes("all_to_all", 100.0, 4) == 75.0
    assert C.fsdp_bytes(96, 64, 4, 2) == (3 * 96 - 64) * 4 / 2
    gather, scatter = C.fsdp_collectives(96, 64, 2, 2, 4)
    assert (gather, scatter) == ((2 * 96 - 64) * 2 / 2, 96 * 4 / 2)
    assert C.fsdp_bytes(96, 64, 4, 2) == sum(C.fsdp_collectives(96, 64, 2, 4, 4))  # one dtype: the same bytes
    assert C.ep_all_to_all(1024.0, 8, 4) == 4 * 3 / 4 * 1024 + 3 / 4 * 8 * 8
    assert [C.shard_axis(f, e) for f, e in ((8, 1), (2, 4), (1, 8))] == ["fsdp", "dp_shard", "ep"]


def test_scale_comm_is_the_shared_fsdp_and_ep_patterns():
    """by_collective on a named MoE shape: the dense FSDP over fsdp × ep, the experts over fsdp and the
    all-to-alls are fsdp_collectives and ep_all_to_all, key by key."""
    shape = Shape.of("olmoe-1b-7b")
    plan = ScalePlan.from_params({"mesh": {"fsdp": 2, "ep": 8}, "local_batch": 4, "seq": 4096})
    comm = C.by_collective(shape, plan)
    psi = P.local_params(shape, plan)
    dense, root = psi - shape.expert_params(), psi - P.local_params(shape, plan, layers_only=True)
    assert (comm["dp_shard/all_gather"], comm["dp_shard/reduce_scatter"]) == C.fsdp_collectives(dense, root, 16, 2, 4)
    experts = C.fsdp_collectives(shape.expert_params() / 8, 0, 2, 2, 4)
    assert (comm["fsdp/all_gather"], comm["fsdp/reduce_scatter"]) == experts
    assert comm["ep/all_to_all"] == 16 * C.ep_all_to_all(4 * 4096 * 8 * 2048 * 2, 64, 8)


def test_flops_per_token_is_6n_plus_12ldt():
    assert flops_per_token(1000, 2, 8, 16) == 6 * 1000 + 12 * 2 * 8 * 16
    shape = Shape.of("llama-3-8b")  # N without the embedding table (a lookup); the untied head counts
    n = shape.params - shape.groups()["embed"]
    assert shape.flops_per_token(8192) == flops_per_token(n, 32, 4096, 8192)


def test_the_package_imports_neither_torch_nor_jax():
    code = (
        "import sys; import steps.analytic.costs, steps.analytic.activations, steps.analytic.flops, "
        "steps.models.shapes, steps.scale.stage; print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=clean_env(), cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


# ---- PP combined (#50 2), by hand on a toy GPT's names: 2 layers on 2 stages, C=4, T=4, batch 8 -------
TOY_GPT = {
    "transformer.wte.weight": 10,
    "transformer.wpe.weight": 4,
    "transformer.h.0.attn.q_proj.weight": 8,  # TP: sharded
    "transformer.h.0.ln_1.weight": 2,  # TP: replicated
    "transformer.h.1.attn.q_proj.weight": 8,
    "transformer.h.1.ln_1.weight": 2,
    "transformer.ln_f.weight": 2,
    "lm_head.weight": 10,
}


def toy_pp(strategy, mesh):
    gpt = {"vocab_size": 8, "block_size": 4, "n_layer": 2, "n_head": 2, "n_embd": 4}
    return toy(strategy=strategy, mesh=mesh, model="gpt", optimizer="sgd", gpt=gpt, microbatches=2)


def test_pipeline_combined_costs_by_hand():
    from steps.analytic.costs import gpt_pipeline_costs

    p = toy_pp("pp_dp", {"pp": 2, "dp": 2})
    assert set(P.gpt_stage_shapes(p, TOY_GPT, 0)) == {
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.h.0.attn.q_proj.weight",
        "transformer.h.0.ln_1.weight",
    }
    assert sum(P.gpt_stage_shapes(p, TOY_GPT, 1).values()) == 8 + 2 + 2 + 10
    # pp_dp: state = 3 tensors (SGD) × the stage × 4 B; comm = the stages' mean of 2Ψ·(N-1)/N (24, 22
    # parameters × 4 B) + the pipeline's acts and grads for the rank's 4 rows: 2·(S-1)·4·T·C·4 B / S
    pipe = 2 * 1 * 4 * 4 * 4 * 4 / 2
    assert gpt_pipeline_costs(p, TOY_GPT, 0) == {
        "state_bytes": 3 * 24 * 4,
        "comm_bytes": (96 + 88) / 2 + pipe,
        "params": 46,
    }
    # pp_fsdp: state halves; nothing resharded after forward under PP, so 2Ψ as DP
    f = gpt_pipeline_costs(toy_pp("pp_fsdp", {"pp": 2, "fsdp": 2}), TOY_GPT, 1)
    assert f == {"state_bytes": 3 * 22 / 2 * 4, "comm_bytes": (96 + 88) / 2 + pipe, "params": 46}
    # pp_tp: q_proj halves; 4 all-reduces of all 8 rows' B·T·C a layer, one layer a stage; the pipeline's 8 rows
    t = gpt_pipeline_costs(toy_pp("pp_tp", {"pp": 2, "tp": 2}), TOY_GPT, 0)
    assert t == {"state_bytes": 3 * (10 + 4 + 4 + 2) * 4, "comm_bytes": 4 * 512 + 2 * pipe, "params": 46}
