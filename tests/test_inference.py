"""The inference stage: cached decoding against HF and uncached decoding (a broken cache fails), the
KV cache's bytes against the formula exactly, and the stage's cells on the smoke DAG."""

from __future__ import annotations

import json

import pytest
import torch

from steps.analytic.kv_cache import CacheShape, max_batch
from steps.inference.cells import cache_shape, check_parity
from steps.inference.decode import build_model, cache_bytes, decode, prompt_ids
from tests.conftest import smoke_cells

TINY = {"vocab_size": 97, "block_size": 32, "n_layer": 2, "n_head": 4, "n_embd": 32}


def test_cache_bytes_formula_by_hand():
    # 2 (k, v) x 3 layers x batch 2 x 10 positions x 2 kv heads x head dim 8 x 4 bytes
    shape = CacheShape(n_layer=3, n_kv_head=2, head_dim=8, bytes_per_element=4)
    assert shape.bytes(2, 10) == 2 * 3 * 2 * 10 * 2 * 8 * 4 == 7680
    assert shape.bytes_per_token() == 2 * 3 * 2 * 8 * 4
    # 1,000 bytes free after 200 of weights, 384 bytes per 2-position sequence: 2 fit, not 3
    assert max_batch(shape, 2, budget_bytes=1_200, weight_bytes=200) == 1_000 // (2 * 3 * 2 * 2 * 8 * 4)
    assert max_batch(shape, 2, budget_bytes=100, weight_bytes=200) == 0


@pytest.mark.parametrize("kv", [4, 2, 1])  # MHA, GQA, MQA
def test_cache_bytes_read_from_the_tensors_equal_the_formula(kv):
    model = build_model(TINY, "float32", 0, "cpu", n_kv_head=kv)
    ids = prompt_ids(TINY["vocab_size"], 3, 7, 1, "cpu")
    _, _, out = decode(model, ids, 5, use_cache=True)
    assert cache_bytes(out.past_key_values) == cache_shape(model).bytes(3, 7 + 5)


def _ours_and_hf():
    from steps.models.hf_convert import to_hf

    ours = build_model(TINY, "float64", 0, "cpu")
    return ours, to_hf(ours), prompt_ids(TINY["vocab_size"], 2, 6, 1, "cpu")


def test_cached_decoding_equals_hf_generate_and_uncached():
    ours, hf, ids = _ours_and_hf()
    m = check_parity(ours, hf, ids, 10, seed=3)
    assert {k: v for k, v in m.items() if "_eq_" in k} == {
        "greedy_cached_eq_uncached": 1.0,
        "greedy_eq_hf": 1.0,
        "sample_cached_eq_uncached": 1.0,
        "sample_eq_hf": 1.0,
    }
    assert m["logits_err_vs_hf"] < 1e-12 and m["logits_err_vs_uncached"] < 1e-12


class OffByOneCache(torch.nn.Module):
    """Our model with a broken cache: each step drops the newest cached position, so every new token
    sits one position early and misses its predecessor's key and value."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, ids, past_key_values=None, use_cache=False, **kw):
        if past_key_values is not None:
            past_key_values = tuple((k[:, :, :-1], v[:, :, :-1]) for k, v in past_key_values)
        return self.model(ids, past_key_values=past_key_values, use_cache=use_cache, **kw)


def test_an_off_by_one_cache_fails_the_parity():
    ours, hf, ids = _ours_and_hf()
    m = check_parity(OffByOneCache(ours), hf, ids, 10, seed=3)
    assert m["logits_err_vs_hf"] > 1e-3 and m["logits_err_vs_uncached"] > 1e-3
    assert m["greedy_cached_eq_uncached"] == 0.0 or m["greedy_eq_hf"] == 0.0 or m["sample_eq_hf"] == 0.0


@pytest.mark.slow
def test_the_smoke_dag_runs_every_inference_cell(smoke_dag):
    got = {}
    for cell in smoke_cells()["inference"]:
        got[cell] = json.loads((smoke_dag / "results" / "inference" / cell / "metrics.json").read_text())
        assert got[cell]["status"] == "ok", (cell, got[cell])
    assert got["parity"]["metrics"]["all_pass"] == 1.0
    assert got["kv_cache"]["metrics"]["cache_bytes_match"] == 1.0
    assert got["attention"]["metrics"]["cache_bytes_match"] == 1.0
    assert got["attention"]["metrics"]["max_batch_match"] == 1.0
    assert got["attention"]["metrics"]["cache_per_token_mha_over_mqa"] == 4.0  # 4 heads vs 1
    assert got["vs_hf"]["metrics"]["same_tokens"] == 1.0
