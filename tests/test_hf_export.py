"""The trained GPT in the formats its users load: gpt_train's `<cell>/hf/` folder through
`transformers.pipeline`, and the model it logs to its MLflow run (real job, real SQLite store).
Reference for every generation: our own greedy `steps.models.generate` on the job's ckpt.pt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from steps.models.generate import generate
from steps.models.gpt import GPTConfig, GPTLMHeadModel
from steps.models.hf_export import LOGIT_TOL, logit_error, unsupported
from tests.conftest import TINY_TRAIN, mlflow_runs, run_stage, stage_params

PROMPTS = ["the king", "thou art fair", "sweet rose of the night"]
N_NEW = 12  # prompt + new tokens stay within block_size 32
TRAIN = {**TINY_TRAIN, "max_steps": 80, "lr": 3e-3, "eval_interval": 40, "ckpt_interval": 40}


@pytest.fixture(scope="module")
def job(gpt_data_dir):
    """One tiny gpt_train job (80 steps: enough that greedy text is not one repeated token)."""
    run_stage(gpt_data_dir, "gpt_train", stage_params("gpt_train", **TRAIN), cell="export")
    folder = gpt_data_dir / "results" / "gpt_train" / "export"
    return gpt_data_dir, folder, json.loads((folder / "metrics.json").read_text())


@pytest.fixture(scope="module")
def ours(job):
    _, folder, _ = job
    ck = torch.load(folder / "ckpt.pt", map_location="cpu", weights_only=False)
    model = GPTLMHeadModel(GPTConfig(**ck["config"]))
    model.load_state_dict(ck["model"])
    return model.eval()


@pytest.fixture(scope="module")
def tok(job):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(job[1] / "hf"))


def our_greedy(model, tok, prompt: str) -> list[int]:
    ids = torch.tensor([tok(prompt)["input_ids"]])
    return generate(model, ids, N_NEW, eos_token_id=tok.eos_token_id)[0].tolist()


def test_folder_is_a_gpt2_checkpoint_with_our_tokenizer(job, ours, tok):
    work, folder, record = job
    hf = folder / "hf"
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in hf.iterdir()
    }
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert (cfg["n_layer"], cfg["n_embd"], cfg["n_positions"]) == (2, 32, 32)
    assert tok.eos_token == "<|endoftext|>" and cfg["eos_token_id"] == tok.eos_token_id
    assert tok.model_max_length == 32
    modes = {p.name: p.stat().st_mode & 0o777 for p in hf.iterdir()}
    assert set(modes.values()) == {modes["config.json"]}, modes  # weights readable like the config
    # the same tokenizer as the one the model was trained with
    assert (hf / "tokenizer.json").read_text() == (work / "results/data/tokenizer/tokenizer.json").read_text()
    assert record["status"] == "ok" and record["info"]["hf_export"] == "results/gpt_train/export/hf"
    assert 0 <= record["metrics"]["hf_export_logit_err"] <= LOGIT_TOL


def test_pipeline_greedy_equals_our_generate(job, ours, tok):
    from transformers import pipeline

    pipe = pipeline("text-generation", model=str(job[1] / "hf"))
    distinct = set()
    for prompt in PROMPTS:
        want = our_greedy(ours, tok, prompt)
        got = pipe(prompt, max_new_tokens=N_NEW, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
        assert list(got) == want, prompt
        distinct |= set(want[len(tok(prompt)["input_ids"]) :])
    assert len(distinct) > 2, "the tiny model generates one token only: the comparison would say little"
    text = pipe(PROMPTS[0], max_new_tokens=N_NEW, do_sample=False)[0]["generated_text"]
    assert text == tok.decode(our_greedy(ours, tok, PROMPTS[0]))


def test_mlflow_model_of_the_run_loads_and_generates(job, ours, tok):
    import mlflow

    work, _, record = job
    uri = record["info"]["mlflow_model"]
    client = mlflow.MlflowClient(f"sqlite:///{work / 'results' / 'mlflow.db'}")
    model_id = uri.removeprefix("models:/")
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == record["run_id"] and logged.experiment_id == record["experiment_id"]
    assert logged.status.name == "READY" and logged.name == "gpt"
    # the runs table's Models column: the run's outputs name the model
    assert [m.model_id for m in client.get_run(record["run_id"]).outputs.model_outputs] == [model_id]
    runs = mlflow_runs(work)
    assert runs.loc[runs.run_id == record["run_id"], "status"].item() == "FINISHED"

    mlflow.set_tracking_uri(f"sqlite:///{work / 'results' / 'mlflow.db'}")
    info = mlflow.models.get_model_info(uri)  # what the model page shows: signature and input example
    assert [i.type for i in info.signature.inputs.inputs] == [mlflow.types.DataType.string]
    assert "max_new_tokens" in [p.name for p in info.signature.params.params]
    example = Path(mlflow.artifacts.download_artifacts(uri)) / info.saved_input_example_info["artifact_path"]
    assert "the king" in example.read_text()
    pipe = mlflow.transformers.load_model(uri)
    for prompt in PROMPTS:
        got = pipe(prompt, max_new_tokens=N_NEW, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
        assert list(got) == our_greedy(ours, tok, prompt), prompt
    pyfunc = mlflow.pyfunc.load_model(uri)
    text = pyfunc.predict([PROMPTS[0]], params={"max_new_tokens": N_NEW})
    assert text == [tok.decode(our_greedy(ours, tok, PROMPTS[0])).strip()]  # MLflow strips the ends


def test_logit_check_sees_a_conversion_bug(job, ours):
    """The export's own check fails on the classic conversion bug: q and k swapped in c_attn."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(str(job[1] / "hf"))
    assert logit_error(ours, hf) <= LOGIT_TOL
    d = ours.config.n_embd
    with torch.no_grad():
        for p in (hf.transformer.h[0].attn.c_attn.weight, hf.transformer.h[0].attn.c_attn.bias):
            q, k = p[..., :d].clone(), p[..., d : 2 * d].clone()
            p[..., :d], p[..., d : 2 * d] = k, q
    assert logit_error(ours, hf) > LOGIT_TOL


def test_config_without_gpt2_equivalent_is_skipped_with_reason(gpt_data_dir):
    assert unsupported(GPTConfig()) is None
    assert "norm=layernorm" in unsupported(GPTConfig(norm="rmsnorm"))
    assert unsupported(GPTConfig(n_kv_head=1)) == "n_kv_head=1 has no GPT-2 equivalent"
    assert unsupported(GPTConfig(n_kv_head=4)) is None  # = n_head: plain multi-head attention
    assert "mlp" in unsupported(GPTConfig(mlp="swiglu"))
    params = stage_params("gpt_train", **{**TINY_TRAIN, "max_steps": 2, "ckpt_interval": 2})
    params["model"]["pos"] = "rope"
    run_stage(gpt_data_dir, "gpt_train", params, cell="rope")
    folder = gpt_data_dir / "results" / "gpt_train" / "rope"
    record = json.loads((folder / "metrics.json").read_text())
    assert record["status"] == "ok"
    assert record["info"]["hf_export"].startswith("skipped: only pos=learned")
    assert "mlflow_model" not in record["info"] and not (folder / "hf").exists()
