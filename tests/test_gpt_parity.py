"""Our GPT == HF GPT2LMHeadModel and LlamaForCausalLM: converter both ways, every layer, every gradient,
greedy tokens."""

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from steps.gpt_parity import greedy_rows
from steps.models import llama_convert
from steps.models.hf_convert import from_hf, hf_to_ours_state_dict, ours_to_hf_state_dict, to_hf
from steps.models.llama_convert import float64_reference
from steps.models.parity import compare, record_activations
from tests.conftest import run_stage, stage_params

torch.set_num_threads(1)
CONFIGS = {
    "gpt2-like": dict(vocab_size=1000, n_positions=32, n_embd=64, n_layer=2, n_head=4),
    "odd": dict(vocab_size=101, n_positions=24, n_embd=48, n_layer=3, n_head=3, activation_function="gelu"),
}


def hf_model(name, dtype):
    torch.manual_seed(0)
    cfg = GPT2Config(
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, **CONFIGS[name]
    )
    return GPT2LMHeadModel(cfg).to(dtype).eval()


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize(
    "dtype,tol,rel,logits_tol", [(torch.float64, 1e-10, None, 1e-10), (torch.float32, None, 1e-6, 1e-6)]
)
@pytest.mark.parametrize("custom", [False, True], ids=["fast", "custom"])
def test_layer_by_layer_and_gradients(name, dtype, tol, rel, logits_tol, custom):
    hf = hf_model(name, dtype)
    ids = torch.randint(0, hf.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    rows, ours = compare(hf, ids, tol, rel, logits_tol, custom=custom)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"weights", "forward", "gradient"}
    n_layer = hf.config.n_layer
    assert sum(r["kind"] == "forward" for r in rows) == 1 + 6 * n_layer + 3  # emb, 6/block, ln_f, logits, loss
    assert sum(r["kind"] == "gradient" for r in rows) == len(list(ours.parameters()))
    assert all(r["pass"] for r in rows), [r for r in rows if not r["pass"]]


def test_converter_round_trip_and_shapes():
    hf = hf_model("odd", torch.float64)
    sd = hf_to_ours_state_dict(hf.state_dict())
    assert sd["transformer.h.0.attn.q_proj.weight"].shape == (48, 48)
    assert sd["transformer.h.0.mlp.c_fc.weight"].shape == (192, 48)  # nn.Linear (out, in)
    back = ours_to_hf_state_dict(sd)
    for k, v in back.items():
        assert torch.equal(v, hf.state_dict()[k]), k
    hf2 = to_hf(from_hf(hf))
    ids = torch.randint(0, 101, (1, 9))
    assert torch.equal(hf2(ids).logits, hf(ids).logits)


def test_hooks_localise_a_difference():
    """A change in block 1's MLP shows up at h.1.mlp first, never in block 0."""
    hf = hf_model("odd", torch.float64)
    ours = from_hf(hf).eval()
    with torch.no_grad():
        ours.transformer.h[1].mlp.c_fc.bias += 1e-3
    ids = torch.randint(0, 101, (1, 9))
    (a, _), (b, _) = record_activations(hf, 3), record_activations(ours, 3)
    hf(ids), ours(ids)
    err = {k: float((a[k] - b[k]).abs().max()) for k in a}
    before = [k for k in err if k.startswith(("embeddings", "h.0.", "h.1.ln", "h.1.attn", "h.1.res"))]
    assert len(before) == 11 and all(err[k] < 1e-12 for k in before), err
    assert err["h.1.mlp"] > 1e-6 and err["ln_f"] > 0


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_equals_hf_generate(name):
    hf = hf_model(name, torch.float64)
    ours = from_hf(hf).eval()
    prompt = torch.randint(0, hf.config.vocab_size, (2, 4), generator=torch.Generator().manual_seed(2))
    rows = greedy_rows(hf, ours, prompt, 10, "float64")
    assert len(rows) == 2 and all(r["pass"] for r in rows), rows


def test_gpt_parity_stage(tmp_path):
    params = stage_params(
        "gpt_parity", dtypes=["float64"], variants=["fast"], hf_config=CONFIGS["odd"], seq_len=12, new_tokens=4
    )
    run_stage(tmp_path, "gpt_parity", params, cell="odd")
    rec = json.loads((tmp_path / "results/gpt_parity/odd/metrics.json").read_text())
    assert rec["status"] == "ok" and rec["run_id"]
    m = rec["metrics"]
    assert m["all_pass"] == 1.0 and m["greedy_match"] == 1.0
    assert m["float64_forward_max_err"] <= 1e-10 and m["float64_gradient_max_err"] <= 1e-10
    assert (tmp_path / "results/gpt_parity/odd/parity.csv").exists()


def test_pretrained_cell_skips_without_cuda(tmp_path):
    params = stage_params("gpt_parity", pretrained="gpt2")
    run_stage(tmp_path, "gpt_parity", params, cell="gpt2")
    rec = json.loads((tmp_path / "results/gpt_parity/gpt2/metrics.json").read_text())
    assert rec["status"] == "skipped" and "CUDA" in rec["reason"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_from_hf_builds_on_the_hf_models_device_and_dtype(dtype):
    """gpt_parity moves the HF model (and the ids) to CUDA: our copy must be built there too, not
    on the CPU. The meta device stands in for CUDA here: a CPU-built model cannot take meta weights."""
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config(bos_token_id=None, eos_token_id=None, **CONFIGS["odd"])).to(dtype)
    ours = from_hf(hf)
    tensors = dict(ours.named_parameters()) | dict(ours.named_buffers())
    assert tensors and {t.device.type for t in tensors.values()} == {"meta"}
    assert {t.dtype for t in ours.parameters()} == {dtype}
    assert ours.lm_head.weight is ours.transformer.wte.weight  # still tied after loading
    back = to_hf(ours)
    assert {t.device.type for t in back.state_dict().values()} == {"meta"}
    assert {t.dtype for t in back.parameters()} == {dtype}


# ---- Llama: HF LlamaForCausalLM (GQA/MQA, SwiGLU, RMSNorm, RoPE theta, untied or tied head) ----
LLAMA = {
    "gqa-untied": dict(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
    ),
    "mqa-tied": dict(
        vocab_size=101,
        hidden_size=48,
        intermediate_size=72,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=1,
        max_position_embeddings=24,
        tie_word_embeddings=True,
    ),
}


def hf_llama(name, dtype, lift=True):
    """Random HF Llama; norm weights N(1, 0.1) as in the stage; fp64 with HF's fp32 islands lifted."""
    torch.manual_seed(0)
    cfg = LlamaConfig(bos_token_id=None, eos_token_id=None, pad_token_id=None, **LLAMA[name])
    hf = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():
        for n, w in hf.named_parameters():
            if n.endswith("norm.weight"):
                w.normal_(1.0, 0.1)
    return float64_reference(hf) if lift and dtype == torch.float64 else hf


@pytest.mark.parametrize("name", LLAMA)
@pytest.mark.parametrize(
    "dtype,tol,rel,logits_tol", [(torch.float64, 1e-10, None, 1e-10), (torch.float32, None, 1e-6, 1e-6)]
)
@pytest.mark.parametrize("custom", [False, True], ids=["fast", "custom"])
def test_llama_layer_by_layer_and_gradients(name, dtype, tol, rel, logits_tol, custom):
    hf = hf_llama(name, dtype)
    ids = torch.randint(0, hf.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    rows, ours = compare(hf, ids, tol, rel, logits_tol, custom=custom)
    n_layer = hf.config.num_hidden_layers
    assert sum(r["kind"] == "forward" for r in rows) == 1 + 6 * n_layer + 3
    grads = [r["point"] for r in rows if r["kind"] == "gradient"]
    assert grads == [k for k, _ in ours.named_parameters()]  # every parameter by name (tied head once)
    assert all(r["pass"] for r in rows), [r for r in rows if not r["pass"]]


def test_llama_config_carried_over_both_ways():
    hf = hf_llama("gqa-untied", torch.float64)
    ours = llama_convert.from_hf(hf)
    c = ours.config
    assert (c.n_kv_head, c.mlp_width, c.rope_theta, c.layer_norm_eps) == (2, 160, 500000.0, 1e-5)
    assert (c.pos, c.norm, c.mlp, c.bias, c.tie_weights) == ("rope", "rmsnorm", "swiglu", False, False)
    assert ours.transformer.h[0].attn.k_proj.weight.shape == (32, 64)  # 2 kv heads × head size 16
    assert ours.lm_head.weight is not ours.transformer.wte.weight
    back = llama_convert.to_hf(ours)
    assert back.config.rope_parameters["rope_theta"] == 500000.0 and back.config.num_key_value_heads == 2
    for k, v in llama_convert.ours_to_hf_state_dict(ours.state_dict()).items():
        assert torch.equal(v, hf.state_dict()[k]), k
    ids = torch.randint(0, 1000, (1, 9))
    assert torch.equal(float64_reference(back)(ids).logits, hf(ids).logits)
    tied = llama_convert.from_hf(hf_llama("mqa-tied", torch.float64))
    assert tied.lm_head.weight is tied.transformer.wte.weight and tied.config.rope_theta == 10000.0


def test_hf_llama_runs_float32_islands_in_a_float64_model():
    """Why float64_reference exists: HF as shipped computes RMSNorm and the RoPE tables in float32,
    so an fp64 HF Llama is only fp32-accurate; lifted, it matches ours to rounding."""
    ids = torch.randint(0, 1000, (2, 33), generator=torch.Generator().manual_seed(1))
    shipped = hf_llama("gqa-untied", torch.float64, lift=False)
    ours = llama_convert.from_hf(shipped).eval()
    with torch.no_grad():
        err = float((ours(ids).logits - shipped(ids).logits).abs().max())
        lifted = float((ours(ids).logits - float64_reference(shipped)(ids).logits).abs().max())
    assert 1e-10 < err < 1e-6, err  # fp32 rounding inside an fp64 model: 5.9e-8
    assert lifted < 1e-12, lifted


def test_llama_converter_rejects_what_ours_lacks():
    for bad in (
        dict(attention_bias=True),
        dict(hidden_act="gelu"),
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    ):
        cfg = LlamaConfig(**{**LLAMA["mqa-tied"], **bad})
        with pytest.raises(ValueError, match="unsupported"):
            llama_convert.config_from_hf(cfg)
    with pytest.raises(ValueError, match="Llama equivalent"):
        llama_convert.hf_config_from_ours(from_hf(hf_model("odd", torch.float64)).config)


def test_llama_swapped_norms_would_be_caught():
    """The stage draws the norm weights (HF sets them to 1): a converter that swapped the two norms
    of a block would show at h.0.ln_1."""
    hf = hf_llama("gqa-untied", torch.float64)
    ours = llama_convert.from_hf(hf).eval()
    blk = ours.transformer.h[0]
    with torch.no_grad():
        w1 = blk.ln_1.weight.clone()
        blk.ln_1.weight.copy_(blk.ln_2.weight), blk.ln_2.weight.copy_(w1)
    ids = torch.randint(0, 1000, (1, 9))
    (a, _), (b, _) = record_activations(hf, 2, llama_convert.HF_MODULES), record_activations(ours, 2)
    hf(ids), ours(ids)
    assert float((a["embeddings"] - b["embeddings"]).abs().max()) == 0
    assert float((a["h.0.ln_1"] - b["h.0.ln_1"]).abs().max()) > 1e-3


@pytest.mark.parametrize("name", LLAMA)
def test_llama_greedy_equals_hf_generate(name):
    """HF generate with its own KV cache vs ours with a GQA/MQA cache (n_kv_head heads) and without."""
    hf = hf_llama(name, torch.float64)
    ours = llama_convert.from_hf(hf).eval()
    prompt = torch.randint(0, hf.config.vocab_size, (2, 4), generator=torch.Generator().manual_seed(2))
    rows = greedy_rows(hf, ours, prompt, 10, "float64")
    assert len(rows) == 2 and all(r["pass"] for r in rows), rows
    kv = ours(prompt, use_cache=True).past_key_values[0][0]
    assert kv.shape[1] == hf.config.num_key_value_heads


def test_llama_cell_of_the_stage(tmp_path):
    params = stage_params("gpt_parity", hf_model="llama", hf_config=LLAMA["gqa-untied"], seq_len=12, new_tokens=4)
    params |= {"tol_fp32_logits": 1e-6, "tol_fp32_rel": 1e-6}  # configs/default.yaml's: HF as shipped in fp32
    run_stage(tmp_path, "gpt_parity", params, cell="llama")
    rec = json.loads((tmp_path / "results/gpt_parity/llama/metrics.json").read_text())
    assert rec["status"] == "ok"
    m = rec["metrics"]
    assert (
        m["all_pass"] == 1.0
        and m["greedy_match"] == 1.0
        and m["n_params"] == 2 * 1000 * 64 + 2 * (4096 + 2 * 2048 + 4096 + 3 * 64 * 160 + 2 * 64) + 64
    )
    assert m["float64_forward_max_err"] <= 1e-10 and m["float64_gradient_max_err"] <= 1e-10
    assert m["float32_logits_err"] <= 1e-6


def test_float64_loss_keeps_float64():
    """A float64 model's loss is computed in float64 (it was cast to float32 once: sharded fp64 runs
    then disagreed with one device by ~1e-7 in loss while their gradients agreed to 1e-17)."""
    from steps.models.gpt import GPTConfig, GPTLMHeadModel, causal_lm_loss
    from steps.models.parity import reference_loss

    torch.manual_seed(0)
    m = GPTLMHeadModel(GPTConfig(vocab_size=97, block_size=16, n_layer=1, n_head=2, n_embd=16)).double()
    ids = torch.randint(0, 97, (3, 16))
    with torch.no_grad():
        logits = m(ids).logits * 30  # large logits: fp32 rounding of the log-sum-exp shows at ~1e-6
    ours, ref = causal_lm_loss(logits, ids), reference_loss(logits, ids)
    by_hand = (logits[:, :-1].logsumexp(-1) - logits[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]).mean()
    assert ours.dtype == ref.dtype == torch.float64
    assert abs(float(ours - by_hand)) <= 1e-12 and abs(float(ref - by_hand)) <= 1e-12
    assert abs(float(F.cross_entropy(logits[:, :-1].float().reshape(-1, 97), ids[:, 1:].reshape(-1)) - by_hand)) > 1e-9
