"""Models on miniTorch: GPT-2 equal to our torch GPT in float64 (logits, loss, every gradient by
name, then the loss over AdamW steps from the same init), the classifier, the translation pipeline
offline on a parallel file written here."""

import numpy as np
import pytest
import torch

import steps.minitorch as mt
from steps.minitorch.classify import GENRE
from steps.minitorch.models import Classifier, DecoderLM, shifted_targets
from steps.minitorch.stage import Trainers, gpt_parity
from steps.models.gpt import GPTConfig, GPTLMHeadModel

TOL = 1e-9


def _torch_gpt(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=37, block_size=8, n_layer=2, n_head=2, n_embd=12, activation="gelu_new")
    return GPTLMHeadModel(GPTConfig(**{**cfg, **kw})).double()


CPU_BACKENDS = [b for b in mt.BACKENDS if b != "cuda"]  # cuda: tests/test_minitorch_kernels.py, simulated


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("activation", ["gelu_new", "gelu"])
def test_gpt_logits_loss_and_every_gradient_match_torch(activation, backend):
    model = _torch_gpt(activation=activation)
    ours = DecoderLM.from_torch(model, backend)
    idx = np.random.default_rng(0).integers(0, 37, (3, 8))
    errors = gpt_parity(model, ours, idx)
    assert max(errors.values()) <= TOL, errors
    assert len(ours.parameters()) == len(list(model.parameters()))  # the tied LM head is the embedding


def test_gpt_parity_catches_a_wrong_weight():
    model = _torch_gpt()
    ours = DecoderLM.from_torch(model)
    w = ours.h[1].mlp.c_fc.bias.value
    w.data.storage[3] += 1e-6  # one number off
    errors = gpt_parity(model, ours, np.random.default_rng(0).integers(0, 37, (2, 8)))
    assert errors["gpt_logits_err"] > TOL


def test_gpt_loss_trajectory_follows_torch_adamw():
    model = _torch_gpt(seed=1)
    trainers = Trainers(model, DecoderLM.from_torch(model), lr=3e-3, weight_decay=0.1)
    rng = np.random.default_rng(1)
    losses = []
    for _ in range(5):
        idx = rng.integers(0, 37, (2, 8))
        losses.append((trainers.step_ours(idx), trainers.step_torch(idx)))
    ours, theirs = np.array(losses).T
    np.testing.assert_allclose(ours, theirs, atol=TOL, rtol=0)
    assert ours[-1] < ours[0]  # it trains


def test_loss_ignores_masked_targets_and_rejects_long_input():
    ours = DecoderLM.from_torch(_torch_gpt())
    idx = np.random.default_rng(2).integers(0, 37, (2, 8))
    full = shifted_targets(idx)
    assert (full[:, -1] == -100).all() and (full[:, :-1] == idx[:, 1:]).all()
    with pytest.raises(ValueError, match="longer than block_size"):
        ours.forward(np.zeros((1, 9), dtype=np.int64))


def test_classifier_beats_the_majority_on_a_separable_problem():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(120, 6))
    y = (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1.0)
    model = Classifier(6, 16, 3, dropout=0.0, rng=rng)
    opt = mt.Adam(model.parameters(), lr=0.05)
    for _ in range(60):
        opt.zero_grad()
        mt.softmax_loss(model(mt.tensor(x)), y).mean().backward()
        opt.step()
    accuracy = (model(mt.tensor(x)).to_numpy().argmax(1) == y).mean()
    majority = np.bincount(y).max() / len(y)
    assert accuracy > majority + 0.2, (accuracy, majority)


def test_genres_are_the_first_folios_three():
    assert set(GENRE.values()) == {"comedy", "history", "tragedy"}


def _pairs_file(path, n=200, seed=0):
    nouns = {"der hund": "the dog", "die katze": "the cat", "das kind": "the child", "der mann": "the man"}
    verbs = {"sieht": "sees", "liebt": "loves", "findet": "finds"}
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        a, b = rng.choice(list(nouns), 2, replace=False)
        v = rng.choice(list(verbs))
        lines.append(f"{a} {v} {b}\t{nouns[a]} {verbs[v]} {nouns[b]}")
    path.write_text("\n".join(lines) + "\n")
    return path


class _Ctx:
    seed = 0

    def __init__(self, out):
        self.out, self.tables = out, {}

    def progress(self, it, **kw):
        return it

    def log_metrics(self, *a, **kw):
        pass

    def log_table(self, df, name):
        self.tables[name] = df


def test_translation_pipeline_offline_scores_its_own_translations(tmp_path):
    import sacrebleu

    from steps.minitorch.config import MinitorchTranslate
    from steps.minitorch.translate import run_translate

    src = _pairs_file(tmp_path / "pairs.tsv")
    t = {
        "source": str(src),
        "max_pairs": 200,
        "test_pairs": 6,
        "block_size": 12,
        "n_layer": 1,
        "n_head": 2,
        "n_embd": 16,
        "steps": 4,
        "batch_size": 8,
        "lr": 1e-2,
        "max_new_tokens": 6,
        "vocab_size": 300,
    }
    ctx = _Ctx(tmp_path)
    out = run_translate(ctx, MinitorchTranslate(**t), "reference")
    table = ctx.tables["translations"]
    assert len(table) == out["test_pairs"] == 6  # the last tenth of 200 lines (20), capped by test_pairs
    assert out["bleu"] == pytest.approx(sacrebleu.corpus_bleu(list(table.translation), [list(table.reference)]).score)


def test_translation_source_errors_name_the_fix(tmp_path):
    from steps.core import InputError
    from steps.minitorch.translate import load_pairs

    with pytest.raises(InputError, match="neither hf:"):
        load_pairs(str(tmp_path / "missing.tsv"))
    bad = tmp_path / "bad.tsv"
    bad.write_text("ein satz ohne tab\n")
    with pytest.raises(InputError, match="bad.tsv:1: expected 'german<TAB>english'"):
        load_pairs(str(bad))
