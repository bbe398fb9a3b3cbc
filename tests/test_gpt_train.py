"""gpt_train: LR schedule, decay groups, exact resume from a checkpoint, the stage end to end
on a tiny corpus (real MLflow), and the chat CLI on its checkpoint."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from steps.config.base import ConfigError
from steps.models.gpt import GPTConfig, GPTLMHeadModel
from steps.models.train_config import Bench, GptTrainConfig
from steps.models.train_step import StepOptions, make_optimizer
from steps.models.training import TokenWindows, lr_at, train
from steps.paired import Ratio
from tests.conftest import TINY_TRAIN, run_module, run_stage, stage_params

torch.set_num_threads(1)


def test_lr_schedule():
    lrs = [lr_at(s, 1.0, 10, 110, 0.1) for s in range(111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55) and lrs[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))


def test_weight_decay_groups():
    m = GPTLMHeadModel(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=1, n_embd=8))
    decay, no_decay = make_optimizer(m, StepOptions(lr=1e-3, weight_decay=0.1)).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))


def _run(tmp_path, name, stop_after=None, init_seed=0):
    torch.manual_seed(init_seed)
    cfg = GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.1)
    model = GPTLMHeadModel(cfg)
    tokens = np.random.default_rng(0).integers(0, 50, 2000)
    p = GptTrainConfig.of(
        {
            **stage_params("gpt_train"),
            "batch_size": 4,
            "grad_accum": 2,
            "max_steps": 8,
            "warmup_steps": 2,
            "eval_interval": 4,
            "eval_batches": 2,
            "ckpt_interval": 1,
        }
    )
    state = train(
        model,
        TokenWindows(tokens, 16, 1),
        TokenWindows(tokens[:500], 16, 2),
        p,
        torch.device("cpu"),
        tmp_path / f"{name}.pt",
        {"fingerprint": "x"},
        stop_after=stop_after,
    )
    return model, state


def test_resume_after_stop_is_exact(tmp_path):
    full, s_full = _run(tmp_path, "full")
    _, s_half = _run(tmp_path, "resumed", stop_after=3)
    assert s_half.step == 3
    # a new process would rebuild the model from a different init: the checkpoint must win
    resumed, s_res = _run(tmp_path, "resumed", init_seed=99)
    assert s_res.step == 8 and len(s_res.history) == 8
    for (n, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), n
    assert [h["train_loss"] for h in s_res.history] == [h["train_loss"] for h in s_full.history]


BENCH = {"enabled": True, "dtypes": ["float32"], "pairs": 3, "steps_per_pair": 1, "warmup": 1}


def test_gpt_train_stage_and_chat(tmp_path, gpt_data_dir):
    """The stage on the fixture corpus, as a job stopped after step 3 (a stand-in for a kill) and
    run again: the second job resumes from the first one's checkpoint (test_resume_after_stop_is_exact
    proves in-process that a resumed run ends bit for bit where an uninterrupted one does), learns,
    logs MLflow metrics, writes ckpt + samples, and benchmarks ours vs HF side by side."""
    params = stage_params("gpt_train", **TINY_TRAIN)
    out = gpt_data_dir / "results/gpt_train/a"
    # the killed job: no samples (beam search) and no bench (off in TINY_TRAIN), only its checkpoint counts
    run_stage(
        gpt_data_dir,
        "gpt_train",
        {**params, "stop_after_steps": 3, "samples": {**params["samples"], "prompts": []}},
        cell="a",
    )
    assert torch.load(out / "ckpt.pt", weights_only=False)["state"]["step"] == 3
    resumed = run_stage(gpt_data_dir, "gpt_train", {**params, "bench": BENCH}, cell="a")
    assert "gpt_train/a/ckpt.pt at step 3" in resumed.stdout, resumed.stdout[-3000:]  # "resumed from ..."
    assert torch.load(out / "ckpt.pt", weights_only=False)["state"]["step"] == 6
    rec = json.loads((out / "metrics.json").read_text())
    assert rec["status"] == "ok" and rec["run_id"]
    m = rec["metrics"]
    assert m["steps"] == 6 and m["val_loss_final"] < m["val_loss_initial"]
    assert [h["step"] for h in json.loads((out / "history.json").read_text())] == list(range(1, 7))
    # MFU = tokens/s x model FLOPs per token (6N + 12·L·d·T, N counted by hand) / measured fp32 peak
    V = len(AutoTokenizer.from_pretrained(str(out / "tokenizer")))
    T, L, d = (TINY_TRAIN["model"][k] for k in ("block_size", "n_layer", "n_embd"))
    n = V * d + L * (12 * d * d + 13 * d) + 2 * d  # wte (tied head) + blocks + ln_f, no wpe
    assert m["n_params_non_embedding"] == n and m["flops_per_token"] == 6 * n + 12 * L * d * T
    assert m["mfu"] == pytest.approx(m["tokens_per_s"] * m["flops_per_token"] / m["matmul_peak_float32"])
    check_bench(rec, out, tokens=TINY_TRAIN["batch_size"] * T)
    assert (out / "loss_curve.png").exists() and "Prompt" in (out / "samples.md").read_text()

    args = ["--checkpoint", str(out / "ckpt.pt"), "--prompt", "the king", "--max-new-tokens", "5"]
    proc = run_module(gpt_data_dir, "steps.chat", args, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("the king"), proc.stderr[-2000:]


def check_bench(rec: dict, out, tokens: int) -> None:
    """The benchmark's numbers against each other and its table: ours/HF with BENCH["pairs"]
    pairs, tokens/s = steps/s x tokens, its MFU from them, the report's string from the ratio."""
    m, key = rec["metrics"], "bench_float32"
    assert m[f"{key}_ours_over_hf_pairs"] == BENCH["pairs"]
    assert m[f"{key}_ours_tokens_s"] == pytest.approx(m[f"{key}_ours_steps_s"] * tokens)
    flops = m[f"{key}_ours_tokens_s"] * m["flops_per_token"]
    assert m[f"{key}_ours_mfu"] == pytest.approx(flops / m["matmul_peak_float32"])
    r = Ratio(m[f"{key}_ours_over_hf"], m[f"{key}_ours_over_hf_low"], m[f"{key}_ours_over_hf_high"], BENCH["pairs"])
    assert rec["info"][f"{key}_ours_vs_hf"] == str(r)
    row = pd.read_csv(out / "benchmark.csv").iloc[0]
    assert row["dtype"] == "float32" and row["pairs"] == BENCH["pairs"]
    assert row["ours/HF"] == pytest.approx(m[f"{key}_ours_over_hf"]) and row["low"] == pytest.approx(r.low)


@pytest.mark.parametrize("name", ["default", "gpu", "hub"])
def test_real_configs_bench_with_enough_pairs(name):
    """ours/HF carries a 95 % interval worth reading only over >= 20 pairs (the smoke config may
    use fewer: it checks the plumbing, not the number)."""
    from steps.config import load_config
    from steps.paired import MIN_PAIRS
    from tests.conftest import ROOT

    files = [ROOT / "configs" / "default.yaml"] + ([ROOT / "configs" / f"{name}.yaml"] if name != "default" else [])
    bench = load_config(*files)["gpt_train"]["bench"]
    assert bench["enabled"] and bench["pairs"] >= MIN_PAIRS and bench["steps_per_pair"] >= 1


def test_bench_ratio_is_ours_over_hf_from_interleaved_pairs():
    """paired_steps times both models' training steps interleaved, and ours/HF reads "how many
    times faster ours is": a model with 1 block against one with 8 (same width) comes out faster,
    its 95 % interval above 1. No timing is asserted, only where the interval lies."""
    from steps.models.bench import paired_steps
    from steps.paired import ratio_of_pairs

    cfg = dict(vocab_size=64, block_size=16, n_head=2, n_embd=32)
    torch.manual_seed(0)
    small, big = GPTLMHeadModel(GPTConfig(n_layer=1, **cfg)), GPTLMHeadModel(GPTConfig(n_layer=8, **cfg))
    batch = torch.randint(0, 64, (4, 16))
    b = Bench(enabled=True, dtypes=["float32"], pairs=8, steps_per_pair=1, warmup=1)  # 8x the work: 8 pairs suffice
    before = [p.detach().clone() for p in small.parameters()]
    ours_s, hf_s = paired_steps(small, big, batch, torch.device("cpu"), StepOptions(), b)
    assert len(ours_s) == len(hf_s) == b.pairs and (ours_s > 0).all()
    r = ratio_of_pairs(ours_s, hf_s)
    assert r.verdict == "faster" and r.low > 1, r
    assert all(torch.equal(a, p) for a, p in zip(before, small.parameters()))  # each trains its own copy


def test_the_stage_tables_percent_of_peak_is_the_benchmark_tables():
    """gpt_train's "fp32 bench % peak" column shows the benchmark table's "ours % of measured matmul
    peak" (71.12), never the fraction under a % title (0.7112)."""
    from steps.models.bench import bench_metrics, bench_row
    from steps.presentation.gpt_train import SHOWN

    peak = {"measured": 2e11, "published": 4e11, "published_name": "test"}
    # 2 steps/s × 64 tokens × 1e9 FLOP/token = 1.28e11 FLOP/s: 64 % of the measured peak
    m = bench_metrics("bench_float32", np.full(3, 0.5), np.full(3, 0.5), Ratio(1.0, 0.9, 1.1, 3), 64, 1e9, peak)
    row = bench_row("float32", m, "bench_float32", peak)
    kind, _, key = SHOWN.columns["fp32 bench % peak"].partition(".")
    assert kind == "metrics" and m[key] == pytest.approx(64.0) == row["ours % of measured matmul peak"]


def test_gpt_train_missing_data_is_clear(tmp_path):
    proc = run_stage(tmp_path, "gpt_train", stage_params("gpt_train", **TINY_TRAIN), check=False)
    assert proc.returncode != 0 and "results/data/corpus does not exist" in proc.stderr


def test_bench_skips_dtypes_without_native_matmul(monkeypatch):
    """bf16 on a CPU without AVX512-BF16/AMX: the benchmark names the reason instead of running
    for hours; fp32 always runs (the probe is stubbed: the test must not depend on the CPU)."""
    from types import SimpleNamespace

    from steps import hardware
    from steps.models.bench import bench_dtypes

    monkeypatch.setattr(
        hardware, "native_matmul", lambda dt, device: (dt == "float32", 1.3e9 if dt != "float32" else 170e9, 170e9)
    )
    ctx, b = (
        SimpleNamespace(info={}),
        Bench(enabled=True, dtypes=["float32", "bfloat16"], pairs=2, steps_per_pair=1, warmup=0),
    )
    assert bench_dtypes(ctx, b, torch.device("cpu")) == ["float32"]
    assert "no native bfloat16 matmul" in ctx.info["bench_skipped"]["bfloat16"]
    assert bench_dtypes(ctx, replace(b, enabled=False), torch.device("cpu")) == []


def test_lora_and_full_finetuning_cells(gpt_data_dir):
    """A base cell, then LoRA and full fine-tuning of its checkpoint (init_from): each starts at the
    base's validation loss, reports its trainable parameters (LoRA: r·(in + out) per adapted matrix)
    and AdamW's state bytes as saved (measured) = 2 moments per trainable element + a step per tensor."""
    base = stage_params("gpt_train", **{**TINY_TRAIN, "samples": {**TINY_TRAIN["samples"], "prompts": []}})
    run_stage(gpt_data_dir, "gpt_train", base, cell="ft_base")
    m0 = json.loads((gpt_data_dir / "results/gpt_train/ft_base/metrics.json").read_text())["metrics"]
    L, d, r = TINY_TRAIN["model"]["n_layer"], TINY_TRAIN["model"]["n_embd"], 4
    lora = {"r": r, "alpha": 8.0, "dropout": 0.0, "targets": ["q_proj", "v_proj", "c_fc"]}
    out = {}
    for cell, extra in (("ft_lora", {"lora": lora}), ("ft_full", {})):
        run_stage(gpt_data_dir, "gpt_train", {**base, "init_from": "ft_base", **extra}, cell=cell)
        out[cell] = json.loads((gpt_data_dir / f"results/gpt_train/{cell}/metrics.json").read_text())["metrics"]
        m = out[cell]
        assert m["val_loss_initial"] == pytest.approx(m0["val_loss_final"], abs=1e-6)  # it started from the base
        assert m["optimizer_state_bytes"] == m["optimizer_state_bytes_analytic"]
    assert out["ft_lora"]["trainable_params"] == L * r * ((d + d) + (d + d) + (d + 4 * d))
    # fp32 moments (2 x 4 bytes an element) + a 4-byte step for each of the 2 x 3 x L adapter tensors
    assert out["ft_lora"]["optimizer_state_bytes"] == 8 * out["ft_lora"]["trainable_params"] + 4 * 6 * L
    assert out["ft_full"]["trainable_fraction"] == 1.0 and out["ft_lora"]["trainable_fraction"] < 0.1
    assert out["ft_lora"]["optimizer_state_bytes"] < out["ft_full"]["optimizer_state_bytes"] / 10
    assert (gpt_data_dir / "results/gpt_train/ft_lora/hf").exists()  # merged, then exported as a plain GPT-2


def test_finetuning_cell_without_its_base_is_clear(gpt_data_dir):
    """An init_from naming no cell stops with the config check; a declared cell whose checkpoint is gone
    stops the job with one line naming the file and the cell to rerun."""
    with pytest.raises(ConfigError, match="gpt_train.init_from"):
        stage_params("gpt_train", **TINY_TRAIN, init_from="nowhere")
    params = stage_params("gpt_train", **TINY_TRAIN)
    assert not (gpt_data_dir / "results/gpt_train/main").exists()
    proc = run_stage(gpt_data_dir, "gpt_train", {**params, "init_from": "main"}, cell="x", check=False)
    assert proc.returncode != 0 and "gpt_train/main/ckpt.pt does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
