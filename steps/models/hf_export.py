"""Our trained GPT in the formats its users load: a Hugging Face folder and an MLflow model.

`export(model, tok, folder)` writes GPT2LMHeadModel's config.json + model.safetensors +
generation_config.json (eos = pad = the tokenizer's eos) and the tokenizer (tokenizer.json +
tokenizer_config.json, `model_max_length` = the model's block size), so

    transformers.pipeline("text-generation", model=folder)("the king", max_new_tokens=20)

completes prompts from it. The weights go through hf_convert.to_hf (our GPT is GPT-2's pre-LN
structure with separate q/k/v); a config GPT-2 cannot express (RoPE, RMSNorm, no biases, ...) is
not exported, and `export_cell` says why in the cell's info.

`export_cell(ctx, model, tok)` is what gpt_train calls: export into `<cell folder>/hf/`, reload the
folder and compare its logits with ours (fp32, CPU, `logit_error` <= LOGIT_TOL), then log the pipeline to
the job's MLflow run with `mlflow.transformers.log_model` (the run's Models column;
`mlflow.transformers.load_model` / `mlflow.pyfunc.load_model` on `models:/<id>`).
"""

from __future__ import annotations

import copy
import time
from importlib.metadata import version
from pathlib import Path

import mlflow
import torch
from mlflow.models import infer_signature
from transformers import pipeline

from steps.models.hf_convert import hf_config_from_ours, to_hf

LOGIT_TOL = 1e-5  # logit_error of the reloaded HF model vs ours, fp32: fused vs split q/k/v differ ~1e-7
FOLDER = "hf"
MODEL_NAME = "gpt"
INPUT_EXAMPLE = ["the king"]  # a prompt: the logged model's signature and its page's input example


def unsupported(config) -> str | None:
    """Why this GPTConfig has no GPT-2 equivalent, or None."""
    try:
        hf_config_from_ours(config)
    except ValueError as exc:
        return str(exc)
    return None


def readable_like_config(folder: str | Path) -> None:
    """transformers writes model.safetensors through a private temporary file (mode 0600): give
    every file of an HF folder the mode its config.json got (the user's umask), so whoever may
    read the run's outputs may load the model too."""
    folder = Path(folder)
    mode = (folder / "config.json").stat().st_mode & 0o777
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(mode)


def export(model, tok, folder: str | Path, max_new_tokens: int = 50) -> Path:
    """Write the HF folder (weights as fp32 safetensors on CPU, whatever device `model` is on)."""
    folder = Path(folder)
    cpu = copy.deepcopy(model).to("cpu", torch.float32).eval()
    hf = to_hf(cpu)
    eos = tok.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token: the exported model could not end a completion")
    for cfg in (hf.config, hf.generation_config):
        cfg.bos_token_id = tok.bos_token_id if tok.bos_token_id is not None else eos
        cfg.eos_token_id = cfg.pad_token_id = eos
    hf.generation_config.max_new_tokens = max_new_tokens
    hf.save_pretrained(str(folder))
    tok = copy.deepcopy(tok)
    tok.model_max_length = model.config.block_size
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.save_pretrained(str(folder))
    readable_like_config(folder)
    return folder


@torch.no_grad()
def logit_error(model, hf_model, seed: int = 0, batch: int = 2) -> float:
    """max |logit difference| / max(1, max |logit|) between our model and an HF model on a random
    full-length batch: absolute for small logits, relative to the logits' scale for large ones."""
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=torch.Generator().manual_seed(seed))
    ours = copy.deepcopy(model).to("cpu", torch.float32).eval()(ids).logits
    theirs = hf_model.to("cpu", torch.float32).eval()(ids).logits
    return ((ours - theirs).abs().max() / ours.abs().max().clamp(min=1.0)).item()


def signature(max_new_tokens: int):
    """Text in, text out, with the generation settings a caller may pass as `params`."""

    params = {"max_new_tokens": max_new_tokens, "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
    return infer_signature(INPUT_EXAMPLE, ["the king is dead"], params=params)


def requirements() -> list[str]:
    """Pinned from this environment (MLflow would otherwise infer them by loading the model again)."""

    return [f"{pkg}=={version(pkg).split('+')[0]}" for pkg in ("torch", "transformers", "tokenizers", "safetensors")]


def log_model(pipe, run_id: str, experiment_id: str, uri: str, max_new_tokens: int, write_lock) -> str:
    """Log a text-generation pipeline to an existing run (its Models column); returns `models:/<id>`.
    `write_lock`: the store's write lock, held around the writes (the job's `ctx.write_lock()`)."""

    mlflow.set_tracking_uri(uri)
    with write_lock:
        # created here so it lives in its run's experiment (log_model alone would use the active one)
        model = mlflow.initialize_logged_model(MODEL_NAME, source_run_id=run_id, experiment_id=experiment_id)
        info = mlflow.transformers.log_model(
            pipe,
            task="text-generation",
            run_id=run_id,
            model_id=model.model_id,
            signature=signature(max_new_tokens),
            input_example=INPUT_EXAMPLE,  # the model page's example; MLflow checks it loads and predicts
            pip_requirements=requirements(),
        )
    return info.model_uri


def export_cell(ctx, model, tok) -> dict:
    """gpt_train's export: `<cell>/hf/`, checked against ours, logged to the job's run.
    Returns metrics; paths, the model URI or the reason for skipping go to ctx.info."""
    reason = unsupported(model.config)
    if reason:
        ctx.info["hf_export"] = f"skipped: {reason}"
        print(f"HF export skipped: {reason}")
        return {}

    n_new = int(ctx.params["samples"]["max_new_tokens"])
    t0 = time.perf_counter()
    folder = export(model, tok, ctx.out / FOLDER, max_new_tokens=n_new)
    pipe = pipeline("text-generation", model=str(folder), device="cpu")
    err = logit_error(model, pipe.model, seed=ctx.seed)
    if not err <= LOGIT_TOL:
        raise RuntimeError(f"HF export {folder}: logits differ from ours, error {err:.3g} > {LOGIT_TOL}")
    out = {"hf_export_logit_err": err, "hf_export_s": time.perf_counter() - t0}
    ctx.info["hf_export"] = str(folder)
    print(f"HF export: {folder} (logit error {err:.2g} <= {LOGIT_TOL}, {out['hf_export_s']:.1f} s)")
    if ctx.run_id:
        t0 = time.perf_counter()
        ctx.info["mlflow_model"] = log_model(pipe, ctx.run_id, ctx.experiment_id, ctx.uri, n_new, ctx.write_lock())
        out["mlflow_log_model_s"] = time.perf_counter() - t0
        print(f"MLflow model: {ctx.info['mlflow_model']} ({out['mlflow_log_model_s']:.1f} s)")
    return out
