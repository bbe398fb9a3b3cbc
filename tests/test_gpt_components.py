"""Hand-written components: gradchecks (float64), NumPy twins, RoPE vs transformers, masks,
and the attention contract other developers rely on (local heads from the tensor shape)."""

import copy
import math

import numpy as np
import pytest
import torch

from steps.models import checks, masking
from steps.models import positional as P
from steps.models.gpt import GPTConfig, GPTLMHeadModel, use_custom_functions
from steps.models.linear import linear
from steps.models.norms import layer_norm, rms_norm
from steps.models.softmax import softmax

torch.set_num_threads(1)


def t64(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize(
    "name,fn,inputs",
    [
        ("softmax", lambda x: softmax(x), lambda: (t64(3, 5),)),
        ("softmax dim 0", lambda x: softmax(x, None, 0), lambda: (t64(4, 3),)),
        ("masked softmax", lambda x: softmax(x, torch.tensor([[True, False, True, True]] * 2)), lambda: (t64(2, 4),)),
        ("linear", linear, lambda: (t64(2, 3, 4), t64(5, 4), t64(5))),
        ("linear no bias", lambda x, w: linear(x, w), lambda: (t64(3, 4), t64(2, 4))),
        ("layernorm", lambda x, w, b: layer_norm(x, w, b, 1e-5), lambda: (t64(2, 3, 6), t64(6), t64(6))),
        ("layernorm no bias", lambda x, w: layer_norm(x, w, None, 1e-5), lambda: (t64(3, 6), t64(6))),
        ("rmsnorm", lambda x, w: rms_norm(x, w, 1e-6), lambda: (t64(2, 3, 6), t64(6))),
    ],
)
def test_gradcheck(name, fn, inputs):
    torch.manual_seed(0)
    assert torch.autograd.gradcheck(fn, inputs(), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("check", checks.PARITY_CHECKS, ids=lambda f: f.__name__)
def test_parity_rows_pass(check):
    torch.manual_seed(0)
    rows = check({})
    assert rows
    bad = [r for r in rows if not r["pass"]]
    assert not bad, bad


def test_masked_softmax_zero_and_stable():
    x = torch.tensor([[1e4, 1e4 + 1, -5.0]], dtype=torch.float64)
    y = softmax(x, torch.tensor([[True, True, False]]))
    assert torch.isfinite(y).all() and y[0, 2] == 0
    np.testing.assert_allclose(y[0, :2].numpy(), [1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-12)


def test_rope_layouts_differ_but_both_rotate():
    x = np.random.default_rng(0).normal(size=(5, 8))
    a, b = P.rope_interleaved_np(x), P.rope_neox_np(x)
    assert not np.allclose(a, b)  # different pairings
    np.testing.assert_allclose(np.linalg.norm(a, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(a[0], x[0])  # position 0: angle 0
    # a cached offset continues the same positions
    np.testing.assert_allclose(P.rope_neox_np(x[3:], offset=3), b[3:], atol=1e-14)


def sinusoidal_by_formula(n_pos: int, d: int, base: float = 10000.0) -> list[list[float]]:
    """Vaswani et al. §3.5 written out, one element at a time: PE[pos, 2i] = sin(pos / base^(2i/d)),
    PE[pos, 2i+1] = cos(pos / base^(2i/d)). Independent of steps/models/positional.py (no arrays)."""
    table = []
    for pos in range(n_pos):
        angle = [pos / base ** (2 * (j // 2) / d) for j in range(d)]
        table.append([math.sin(a) if j % 2 == 0 else math.cos(a) for j, a in enumerate(angle)])
    return table


def swapped_sin_cos(n_pos: int, d: int) -> torch.Tensor:
    """A deliberately wrong table: cos in the even columns, sin in the odd ones."""
    pe = P.sinusoidal(n_pos, d, dtype=torch.float64)
    return torch.stack((pe[:, 1::2], pe[:, 0::2]), -1).flatten(-2)


def frequency_off_by_two(n_pos: int, d: int) -> torch.Tensor:
    """A deliberately wrong table: base^(i/d) for pair i instead of base^(2i/d)."""
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] / 10000.0 ** (torch.arange(d // 2) / d)
    return torch.stack((ang.sin(), ang.cos()), -1).flatten(-2)


@pytest.mark.parametrize("n_pos,d", [(64, 16), (33, 7), (5, 2)])
def test_sinusoidal_equals_the_formula_written_out(n_pos, d):
    """Ours (torch and the NumPy twin) against the formula element by element, float64, at 1e-12
    (measured: a few 1e-15 up to position 63), and against transformers' XLM table (float32, 1e-7)."""
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    want = torch.tensor(sinusoidal_by_formula(n_pos, d), dtype=torch.float64)
    for ours in (P.sinusoidal(n_pos, d, dtype=torch.float64), torch.from_numpy(P.sinusoidal_np(n_pos, d))):
        assert checks.row("PE", "formula", ours, want, 1e-12)["pass"]
    hf = create_sinusoidal_embeddings(n_pos, d, torch.empty(n_pos, d, dtype=torch.float64))
    assert checks.row("PE", "XLM", P.sinusoidal(n_pos, d, dtype=torch.float64), hf, 1e-7)["pass"]


@pytest.mark.parametrize("wrong", [swapped_sin_cos, frequency_off_by_two], ids=lambda f: f.__name__)
def test_a_wrong_sinusoidal_table_fails_both_references(wrong):
    """The references can fail: sin and cos swapped, or the frequency's exponent halved, miss the
    formula and the XLM table by far more than their tolerances."""
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    n_pos, d = 64, 16
    bad = wrong(n_pos, d)
    vs_formula = checks.row("PE", "formula", bad, torch.tensor(sinusoidal_by_formula(n_pos, d)), 1e-12)
    vs_hf = checks.row("PE", "XLM", bad, create_sinusoidal_embeddings(n_pos, d, torch.empty(n_pos, d)), 1e-7)
    assert not vs_formula["pass"] and not vs_hf["pass"]
    assert vs_formula["max_abs_err"] > 0.1 and vs_hf["max_abs_err"] > 0.1


def test_masks():
    c = masking.causal_mask(3)
    assert c.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    m = masking.combined_mask([3, 1], 3)
    assert m.shape == (2, 3, 3) and m[1].sum() == 3 and not m[1][:, 1:].any()
    assert masking.additive(c)[0, 1] == -np.inf


def test_attention_paths_agree_with_and_without_cache():
    torch.manual_seed(0)
    for pos in ("learned", "rope"):
        m = GPTLMHeadModel(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16, pos=pos)).double()
        manual = copy.deepcopy(m)
        for blk in manual.transformer.h:
            blk.attn.impl = "manual"
        ids = torch.randint(0, 50, (2, 11))
        full = m(ids).logits
        torch.testing.assert_close(manual(ids).logits, full, rtol=0, atol=1e-12)
        for model in (m, manual):  # 7 tokens, then 3 at once, then 1: bottom-right causal masks
            a = model(ids[:, :7], use_cache=True)
            b = model(ids[:, 7:10], past_key_values=a.past_key_values, use_cache=True)
            c = model(ids[:, 10:], past_key_values=b.past_key_values, use_cache=True)
            torch.testing.assert_close(torch.cat([a.logits, b.logits, c.logits], 1), full, rtol=0, atol=1e-12)


def test_attention_local_heads_like_tensor_parallel():
    """Rank r holds heads [r*h/2, (r+1)*h/2): q/k/v rows (colwise) and o_proj columns (rowwise).
    Summing the ranks' partial outputs (the all-reduce) gives the full attention output."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=4, n_embd=16, bias=False)
    attn = GPTLMHeadModel(cfg).double().transformer.h[0].attn
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    parts = []
    for r in range(2):
        shard = copy.deepcopy(attn)
        rows = slice(8 * r, 8 * (r + 1))
        for name in ("q_proj", "k_proj", "v_proj"):
            lin = getattr(shard, name)
            lin.weight = torch.nn.Parameter(lin.weight[rows].clone())
        shard.o_proj.weight = torch.nn.Parameter(shard.o_proj.weight[:, rows].clone())
        parts.append(shard(x))
    torch.testing.assert_close(parts[0] + parts[1], attn(x), rtol=0, atol=1e-12)
    # hooks (what parallelize_module installs) switch the fused-qkv shortcut off: modules are called
    calls = []
    attn.k_proj.register_forward_hook(lambda *a: calls.append(1))
    torch.testing.assert_close(attn(x), parts[0] + parts[1], rtol=0, atol=1e-12)
    assert calls == [1]


def test_custom_functions_swap_keeps_state_dict_and_grads():
    torch.manual_seed(0)
    m = GPTLMHeadModel(GPTConfig(vocab_size=30, block_size=8, n_layer=1, n_head=2, n_embd=8, norm="rmsnorm")).double()
    c = use_custom_functions(copy.deepcopy(m))
    assert list(c.state_dict()) == list(m.state_dict())
    assert c.lm_head.weight is c.transformer.wte.weight  # tying survives the swap
    ids = torch.randint(0, 30, (2, 8))
    m(ids, labels=ids).loss.backward()
    c(ids, labels=ids).loss.backward()
    for (n, a), (_, b) in zip(m.named_parameters(), c.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-12, msg=n)


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=10, n_head=3)
    m = GPTLMHeadModel(GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=1, n_embd=4))
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, 5, dtype=torch.long))


def test_activation_checkpointing_same_gradients_and_param_count():
    from transformers import GPT2LMHeadModel

    from steps.models.hf_convert import hf_config_from_ours

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=30, block_size=8, n_layer=2, n_head=2, n_embd=8)
    m = GPTLMHeadModel(cfg).double()
    c = copy.deepcopy(m)
    c.config.checkpoint_activations = True
    ids = torch.randint(0, 30, (2, 8))
    m(ids, labels=ids).loss.backward()
    c(ids, labels=ids).loss.backward()
    for (n, a), (_, b) in zip(m.named_parameters(), c.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-14, msg=n)
    assert m.num_params(non_embedding=False) == GPT2LMHeadModel(hf_config_from_ours(cfg)).num_parameters()
    assert m.num_params() == m.num_params(non_embedding=False) - 8 * 8  # minus wpe


LLAMA_KW = dict(pos="rope", norm="rmsnorm", mlp="swiglu", mlp_hidden=40, bias=False, tie_weights=False, rope_theta=5e5)


@pytest.mark.parametrize("n_kv_head", [1, 2, 6])
def test_grouped_query_equals_multi_head_with_repeated_kv(n_kv_head):
    """GQA/MQA == MHA whose key/value head j is kv head j // (n_head / n_kv_head), both attention
    paths, with and without the KV cache (which holds n_kv_head heads only)."""
    torch.manual_seed(0)
    base = dict(vocab_size=50, block_size=16, n_layer=2, n_head=6, n_embd=24, **LLAMA_KW)
    gqa = GPTLMHeadModel(GPTConfig(n_kv_head=n_kv_head, **base)).double()
    mha = GPTLMHeadModel(GPTConfig(**base)).double()
    sd = gqa.state_dict()
    for k, v in sd.items():
        if k.endswith(("k_proj.weight", "v_proj.weight")):  # (n_kv·hs, C) -> (n_head·hs, C)
            sd[k] = v.view(n_kv_head, 4, 24).repeat_interleave(6 // n_kv_head, 0).reshape(24, 24)
    mha.load_state_dict(sd)
    ids = torch.randint(0, 50, (2, 11))
    full = mha(ids).logits
    for impl in ("sdpa", "manual"):
        for blk in gqa.transformer.h:
            blk.attn.impl = impl
        torch.testing.assert_close(gqa(ids).logits, full, rtol=0, atol=1e-12)
        a = gqa(ids[:, :7], use_cache=True)
        b = gqa(ids[:, 7:10], past_key_values=a.past_key_values, use_cache=True)
        c = gqa(ids[:, 10:], past_key_values=b.past_key_values, use_cache=True)
        assert c.past_key_values[0][0].shape == (2, n_kv_head, 11, 4)
        torch.testing.assert_close(torch.cat([a.logits, b.logits, c.logits], 1), full, rtol=0, atol=1e-12)


def _tp_shards(module, col: tuple, row: tuple, ranks: int = 2):
    """Rank r's copy: `col` Linears keep rows r/ranks (ColwiseParallel), `row` Linears columns (Rowwise)."""
    shards = []
    for r in range(ranks):
        shard = copy.deepcopy(module)
        for name in col + row:
            lin = getattr(shard, name)
            w = lin.weight.chunk(ranks, 0 if name in col else 1)[r]
            lin.weight = torch.nn.Parameter(w.clone())
        shards.append(shard)
    return shards


def test_grouped_query_attention_and_swiglu_split_like_tensor_parallel():
    """With n_kv_head divisible by tp, rank r holds query heads r·nh/tp.. and kv heads r·nkv/tp..:
    the grouping survives and the ranks' partial outputs sum to the full output. MQA over 2 ranks
    (one kv head split in half) and a SwiGLU with an unsharded gate fail with a clear error."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    for impl in ("sdpa", "manual"):
        cfg = GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=4, n_kv_head=2, n_embd=16, attn=impl, **LLAMA_KW)
        blk = GPTLMHeadModel(cfg).double().transformer.h[0]
        parts = [s(x) for s in _tp_shards(blk.attn, ("q_proj", "k_proj", "v_proj"), ("o_proj",))]
        torch.testing.assert_close(parts[0] + parts[1], blk.attn(x), rtol=0, atol=1e-12)
        parts = [s(x) for s in _tp_shards(blk.mlp, ("c_fc", "c_fc2"), ("c_proj",))]
        torch.testing.assert_close(parts[0] + parts[1], blk.mlp(x), rtol=0, atol=1e-12)
    mqa = GPTLMHeadModel(
        GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=4, n_kv_head=1, n_embd=16, bias=False)
    )
    shard = _tp_shards(mqa.transformer.h[0].attn, ("q_proj", "k_proj", "v_proj"), ("o_proj",))[0]
    with pytest.raises(ValueError, match="n_kv_head must be divisible by the tp degree"):
        shard(x.float())
    with pytest.raises(ValueError, match="shard mlp.c_fc2 like mlp.c_fc"):
        _tp_shards(blk.mlp, ("c_fc",), ("c_proj",))[0](x)


def test_llama_options_config_errors_and_widths():
    with pytest.raises(ValueError, match="n_kv_head=3 must divide n_head=4"):
        GPTConfig(n_head=4, n_kv_head=3)
    with pytest.raises(ValueError, match="mlp must be"):
        GPTConfig(mlp="geglu")
    assert GPTConfig(n_embd=64).mlp_width == 256 and GPTConfig(n_embd=64, mlp="swiglu").mlp_width == 256
    assert GPTConfig(n_embd=4096, n_head=32, mlp="swiglu").mlp_width == 11008  # Llama-2-7B
    m = GPTLMHeadModel(GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=4, n_embd=16, n_kv_head=1, **LLAMA_KW))
    names = {k: tuple(p.shape) for k, p in m.named_parameters()}
    assert names["transformer.h.0.attn.k_proj.weight"] == (4, 16) and names["transformer.h.0.mlp.c_fc2.weight"] == (
        40,
        16,
    )
    assert not any(k.endswith("bias") for k in names) and "lm_head.weight" in names  # no biases, untied head
