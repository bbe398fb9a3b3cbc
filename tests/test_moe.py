"""Mixture of experts (steps/models/moe.py): our MoE GPT == HF MixtralForCausalLM layer by layer and
gradient by gradient in float64; the router's top-k, the load-balancing loss and the capacity drop
against a hand-computed case."""

import json
import math

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from steps.models import mixtral_convert
from steps.models.gpt import GPTConfig, GPTLMHeadModel
from steps.models.moe import MoE, load_balancing_loss
from steps.models.parity import compare
from tests.conftest import run_stage, stage_params

torch.set_num_threads(1)
MIXTRAL = dict(
    vocab_size=100,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    router_aux_loss_coef=0.02,
)


def hf_mixtral(dtype, lift=True, **over):
    torch.manual_seed(0)
    cfg = MixtralConfig(bos_token_id=None, eos_token_id=None, pad_token_id=None, **{**MIXTRAL, **over})
    hf = MixtralForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        for n, w in hf.named_parameters():
            if n.endswith("norm.weight"):
                w.normal_(1.0, 0.1)
    return mixtral_convert.float64_reference(hf) if lift and dtype == torch.float64 else hf


@pytest.mark.parametrize(
    "dtype,tol,rel,logits_tol", [(torch.float64, 1e-10, None, 1e-10), (torch.float32, None, 1e-6, 1e-6)]
)
@pytest.mark.parametrize("custom", [False, True], ids=["fast", "custom"])
def test_moe_layer_by_layer_and_gradients_vs_hf_mixtral(dtype, tol, rel, logits_tol, custom):
    hf = hf_mixtral(dtype)
    ids = torch.randint(0, 100, (2, 17), generator=torch.Generator().manual_seed(1))
    rows, ours = compare(hf, ids, tol, rel, logits_tol, custom=custom)
    points = [r["point"] for r in rows if r["kind"] == "forward"]
    assert points.count("load-balancing loss") == 1 and sum("router logits" in p for p in points) == 2
    assert len(points) == 1 + 7 * 2 + 4  # emb, 7 per block (router too), ln_f, logits, aux, loss
    grads = [r["point"] for r in rows if r["kind"] == "gradient"]
    assert grads == [k for k, _ in ours.named_parameters()] and "transformer.h.1.mlp.experts.c_fc2" in grads
    assert all(r["pass"] for r in rows), [r for r in rows if not r["pass"]]
    assert ours.config.moe == {
        "experts": 4,
        "top_k": 2,
        "aux_loss_coef": 0.02,
        "capacity_factor": None,
        "norm_topk_prob": True,
    }
    if dtype == torch.float64:  # the router's gradient includes the aux loss's: nonzero and equal to HF's
        g = next(r for r in rows if r["point"] == "transformer.h.0.mlp.gate.weight")
        assert g["ref_max_abs"] > 1e-4 and g["max_abs_err"] < 1e-14


def test_hf_mixtral_float32_islands_and_converter_round_trip():
    """Why mixtral_convert.float64_reference exists: HF as shipped computes the router softmax and the
    load-balancing loss in float32 (plus RMSNorm and RoPE), ~1e-8 off in a float64 model."""
    ids = torch.randint(0, 100, (2, 17), generator=torch.Generator().manual_seed(1))
    shipped = hf_mixtral(torch.float64, lift=False)
    shipped.config._experts_implementation = "eager"  # grouped_mm has no float64
    ours = mixtral_convert.from_hf(shipped).eval()
    with torch.no_grad():
        a, b = ours(ids, labels=ids), shipped(ids, labels=ids, output_router_logits=True)
        assert 1e-12 < float((a.aux_loss - b.aux_loss).abs()) < 1e-5
        lifted = mixtral_convert.float64_reference(shipped)(ids, labels=ids, output_router_logits=True)
        assert float((a.aux_loss - lifted.aux_loss).abs()) < 1e-14
        assert float((a.logits - lifted.logits).abs().max()) < 1e-12
    back = mixtral_convert.to_hf(ours)
    for k, v in mixtral_convert.ours_to_hf_state_dict(ours.state_dict()).items():
        assert torch.equal(v, shipped.state_dict()[k]), k
    assert back.config.num_local_experts == 4 and back.config.router_aux_loss_coef == 0.02


def hand_moe(capacity_factor=None):
    """E=3 experts, top-2, N=4 tokens x = I_4 (C=4), so token n's router logits are gate.weight[:, n]:
    log-probabilities of the rows of P below, whose softmax is P itself."""
    cfg = GPTConfig(
        n_embd=4,
        n_head=1,
        mlp="swiglu",
        mlp_hidden=5,
        bias=False,
        moe={"experts": 3, "top_k": 2, "capacity_factor": capacity_factor},
    )
    moe = MoE(cfg).double()
    P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.25, 0.15, 0.6], [0.7, 0.2, 0.1]], dtype=torch.float64)
    with torch.no_grad():
        moe.gate.weight.copy_(P.log().T)  # (E, C)
    x = torch.eye(4, dtype=torch.float64)[None]  # (1, 4, 4)
    dense = torch.stack([moe.experts(x[0], [0] * e + [4] + [0] * (2 - e)) for e in range(3)], 1)  # (N, E, C)
    return moe, x, dense


def test_router_topk_weights_and_load_balancing_loss_by_hand():
    moe, x, dense = hand_moe()
    with torch.no_grad():
        y = moe(x)[0]  # (4, 4)
    # top-2 of each row of P, renormalised: token 0 -> {0: .5/.8, 1: .3/.8}, 1 -> {1: .6/.9, 2: .3/.9}, ...
    G = torch.tensor(
        [[0.5 / 0.8, 0.3 / 0.8, 0], [0, 0.6 / 0.9, 0.3 / 0.9], [0.25 / 0.85, 0, 0.6 / 0.85], [0.7 / 0.9, 0.2 / 0.9, 0]],
        dtype=torch.float64,
    )
    assert torch.allclose(y, (G[..., None] * dense).sum(1), atol=1e-15, rtol=0)
    counts, prob_sum, n = moe.stats
    assert counts.tolist() == [3, 3, 2] and n == 4 and moe.dropped == 0
    # f = counts / N = (.75, .75, .5); P_e = mean prob = (1.55, 1.25, 1.2) / 4; aux = 3 * sum f P = 2.025
    assert abs(float(load_balancing_loss([moe.stats])) - 2.025) < 1e-14
    # pooled over layers as HF does: the same stats twice give the same loss; uniform routing gives top_k
    assert abs(float(load_balancing_loss([moe.stats, moe.stats])) - 2.025) < 1e-14
    uniform = (torch.full((3,), 8 / 3, dtype=torch.float64), torch.full((3,), 4 / 3, dtype=torch.float64), 4)
    assert abs(float(load_balancing_loss([uniform])) - 2.0) < 1e-14


def test_capacity_factor_drops_late_assignments_by_hand():
    """capacity = ceil(0.75 · 4 · 2 / 3) = 2. Token-major queues: expert 0 gets tokens 0, 2, 3 and
    expert 1 tokens 0, 1, 3, so token 3 loses both its experts (2 dropped); token 2 keeps both."""
    moe, x, dense = hand_moe(capacity_factor=0.75)
    assert math.ceil(0.75 * 4 * 2 / 3) == 2
    y = moe(x)[0]
    assert moe.dropped == 2
    assert float(y[3].abs().max()) == 0.0
    assert torch.allclose(y[2], 0.25 / 0.85 * dense[2, 0] + 0.6 / 0.85 * dense[2, 2], atol=1e-15, rtol=0)
    assert moe.stats[0].tolist() == [3, 3, 2]  # the aux loss sees the router's choices, dropped or not
    big, _, _ = hand_moe(capacity_factor=2.0)
    big(x)
    assert big.dropped == 0


def test_moe_gpt_trains_and_aux_loss_is_in_the_loss():
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, moe={"experts": 4, "top_k": 1})
    torch.manual_seed(0)
    m = GPTLMHeadModel(cfg)
    ids = torch.randint(0, 64, (2, 16))
    out = m(ids, labels=ids)
    m.config.moe["aux_loss_coef"] = 0.0
    assert abs(float(out.loss - m(ids, labels=ids).loss) - 0.001 * float(out.aux_loss)) < 1e-6
    out.loss.backward()
    assert all(p.grad is not None for p in m.parameters())
    assert m.transformer.h[0].mlp.experts.c_fc.shape == (4, 64, 16)  # gelu experts of 4·C


@pytest.mark.parametrize(
    "moe,match",
    [
        ({"experts": 2, "top_k": 3}, "top_k <= experts"),
        ({"experts": 4, "capacity_factor": 0}, "capacity_factor"),
        ({"expert": 4}, "unknown keys"),
    ],
)
def test_bad_moe_config_says_which_field(moe, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(moe=moe)


def test_moe_cell_of_the_stage(tmp_path):
    hf_config = {**MIXTRAL, "num_hidden_layers": 1}
    params = stage_params("gpt_parity", hf_model="mixtral", hf_config=hf_config, seq_len=12, new_tokens=4)
    params |= {"tol_fp32_logits": 1e-6, "tol_fp32_rel": 1e-6}  # configs/default.yaml's: HF as shipped in fp32
    run_stage(tmp_path, "gpt_parity", params, cell="moe")
    rec = json.loads((tmp_path / "results/gpt_parity/moe/metrics.json").read_text())
    assert rec["status"] == "ok"
    m = rec["metrics"]
    assert m["all_pass"] == 1.0 and m["greedy_match"] == 1.0
    assert m["float64_forward_max_err"] <= 1e-10 and m["float64_gradient_max_err"] <= 1e-10
