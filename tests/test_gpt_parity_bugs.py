"""The seed's GPT-2 bug catalogue: each bug planted in a copy of our GPT, and the layer-by-layer harness
names the first module whose output differs from HF GPT-2 (steps/models/parity_bugs.py)."""

import json

import pandas as pd
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from steps.models.parity import compare
from steps.models.parity_bugs import BUGS, catalogue_rows, first_flagged, plant
from steps.presentation.gpt_parity import SHOWN, columns_for
from tests.conftest import run_stage, stage_params

torch.set_num_threads(1)
TINY = dict(vocab_size=200, n_positions=24, n_embd=32, n_layer=2, n_head=4)


def hf_gpt2(dtype=torch.float64):
    torch.manual_seed(0)
    cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, **TINY)
    return GPT2LMHeadModel(cfg).to(dtype).eval()


IDS = torch.randint(0, TINY["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("bug", BUGS)
def test_each_bug_is_flagged_first_at_its_module(bug):
    (row,) = catalogue_rows(hf_gpt2(), IDS, 1e-10, None, 1e-10, bugs=[bug])
    assert row["first_flagged"] == BUGS[bug][1], row
    assert row["localised"] and row["first_err"] > 1e3 * row["first_tol"], row
    assert row["logits_err"] > 1e-8 and row["gradients_flagged"] > 0, row
    assert row["weights_flagged"] == (bug == "conv1d_not_transposed"), (
        row
    )  # only the loader bug shows in the round trip


def test_without_a_bug_nothing_is_flagged():
    """The control: the same harness on our model built right flags no point (so a flagged point is the bug)."""
    rows, _ = compare(hf_gpt2(), IDS, 1e-10, None, 1e-10)
    assert first_flagged(rows) is None and all(r["pass"] for r in rows)


def test_planting_leaves_the_model_classes_alone():
    """Bugs go into a copy: a model built afterwards by the converter is still exact."""
    hf = hf_gpt2()
    for bug in BUGS:
        plant(hf, bug)
    test_without_a_bug_nothing_is_flagged()


def test_gelu_bug_needs_a_gelu_new_model():
    hf = GPT2LMHeadModel(GPT2Config(activation_function="gelu", bos_token_id=None, eos_token_id=None, **TINY))
    with pytest.raises(ValueError, match="gelu_new"):
        plant(hf, "gelu_not_gelu_new")


def test_stage_logs_the_bug_table(tmp_path):
    params = stage_params(
        "gpt_parity", dtypes=["float64"], variants=["fast"], hf_config=TINY, seq_len=12, new_tokens=4, bugs=list(BUGS)
    )
    run_stage(tmp_path, "gpt_parity", params, cell="tiny")
    rec = json.loads((tmp_path / "results/gpt_parity/tiny/metrics.json").read_text())
    assert rec["status"] == "ok" and rec["metrics"]["bugs_localised"] == 1.0
    assert rec["metrics"]["all_pass"] == 1.0  # the unplanted parity rows are unaffected
    title = "planted bugs named"  # the report's column, shown for cells that plant bugs only
    assert SHOWN.columns[title].partition(".")[2] in rec["metrics"]
    assert title in columns_for(params) and title not in columns_for({"bugs": []})
    df = pd.read_csv(tmp_path / "results/gpt_parity/tiny/bugs.csv")
    assert list(df.bug) == list(BUGS) and (df.first_flagged == df.expected).all()


def test_stage_rejects_bugs_on_a_llama_cell(tmp_path):
    params = stage_params("gpt_parity", hf_model="llama", bugs=["no_causal_mask"])
    proc = run_stage(tmp_path, "gpt_parity", params, cell="llama", check=False)
    assert proc.returncode != 0 and "gpt2 cells only" in proc.stderr and "Traceback" not in proc.stderr
