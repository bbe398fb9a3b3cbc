"""gpt_train: train our GPT on the corpus with the trained tokenizer, then benchmark it
against HF GPT2LMHeadModel (same config, batch, dtype; side by side, steps/models/bench.py) and
sample from it.

Logs per-step train loss / lr / grad norm, periodic validation loss and perplexity, tokens/s and
MFU (model FLOPs 6N + 12·L·d·T per token against the matmul peak measured here, same dtype and
threads, and on a GPU against its published dense peak), a loss-curve plot, and generated
samples. Writes ckpt.pt (+ tokenizer/) for
`python -m steps.chat --checkpoint results/gpt_train/<cell>/ckpt.pt`; a killed job resumes from it.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import datasets
import matplotlib
import numpy as np
import torch
from transformers import AutoTokenizer

from steps.analytic.flops import flops_per_token
from steps.core import InputError, Stage, StageRun
from steps.hardware import mfu, peak_flops
from steps.models.bench import bench_dtypes, run_benchmark
from steps.models.generate import WHITESPACE_NOTE, beam_search, generate, visible
from steps.models.gpt import GPTConfig, GPTLMHeadModel
from steps.models.hf_export import export_cell
from steps.models.lora import adamw_state_bytes_analytic, apply_lora, merge_lora, optimizer_state_bytes
from steps.models.train_config import GptTrainConfig, Samples
from steps.models.train_step import matmul_dtype
from steps.models.training import TokenWindows, evaluate, read_checkpoint, train
from steps.presentation.gpt_train import SHOWN

matplotlib.use("Agg")  # jobs draw to files, never to a display
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend


def tokenize_split(tok, texts, max_tokens: int | None) -> "np.ndarray":
    """One stream: documents joined by EOS so the model learns where texts end."""
    eos = tok.eos_token_id
    out, n = [], 0
    for i in range(0, len(texts), 256):
        for ids in tok(texts[i : i + 256], add_special_tokens=False)["input_ids"]:
            out.append(np.asarray(ids + ([eos] if eos is not None else []), dtype=np.int32))
            n += len(out[-1])
        if max_tokens and n >= max_tokens:
            break
    stream = np.concatenate(out)
    return stream[:max_tokens] if max_tokens else stream


GPT_TRAIN_KNOBS = ("gpt_train.model.block_size", "gpt_train.max_train_tokens")


def check_long_enough(tokens: np.ndarray, block_size: int, corpus: str, split: str, knobs: tuple[str, str]) -> None:
    """A window needs block_size + 1 tokens (inputs and their next-token labels): a shorter split
    stops the job with the numbers and the knobs to change, not TokenWindows' bare ValueError."""
    if len(tokens) <= block_size:
        block_knob, cap_knob = knobs
        raise InputError(
            f"{corpus}: the {split} split has {len(tokens)} tokens, not more than the block size {block_size}; "
            f"lower {block_knob}, raise {cap_knob} if it caps the split, or give prepare_corpus more text "
            "(prepare_corpus.source, max_documents, val_fraction)"
        )


def load_data(
    block_size: int, max_tokens: int | None, seed, corpus: str, tokenizer: str, knobs: tuple[str, str] = GPT_TRAIN_KNOBS
):
    for d in (corpus, tokenizer):
        if not Path(d).exists():
            raise InputError(f"{d} does not exist; fix: run `snakemake --cores 2 {d}` (data.smk) first")
    tok = AutoTokenizer.from_pretrained(tokenizer)
    dd = datasets.load_from_disk(corpus)
    for split in ("train", "validation"):
        if split not in dd or "text" not in dd[split].column_names:
            raise InputError(
                f"{corpus}: needs splits train/validation with column 'text'; "
                f"found {dict((k, v.column_names) for k, v in dd.items())}"
            )
    train = tokenize_split(tok, dd["train"]["text"], max_tokens)
    val = tokenize_split(tok, dd["validation"]["text"], max_tokens)
    check_long_enough(train, block_size, corpus, "train", knobs)
    check_long_enough(val, block_size, corpus, "validation", knobs)
    return tok, TokenWindows(train, block_size, seed), TokenWindows(val, block_size, seed + 1)


def model_config(p: GptTrainConfig, tok) -> GPTConfig:
    """The section's model with the vocabulary filled in (None = the tokenizer's size)."""
    vocab_size = p.model.vocab_size or len(tok)
    if vocab_size < len(tok):
        raise InputError(f"gpt_train.model.vocab_size={vocab_size} < tokenizer size {len(tok)}")
    return replace(p.model, vocab_size=vocab_size)


def plot_curves(ctx, history):
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in history], [h["train_loss"] for h in history], lw=0.8, label="train")
    ev = [h for h in history if "val_loss" in h]
    ax.plot([h["step"] for h in ev], [h["val_loss"] for h in ev], "o-", label="validation")
    ax.set_xlabel("optimizer step"), ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"gpt_train:{ctx.cell}"), ax.legend(), ax.grid(alpha=0.3)
    ctx.log_figure(fig, "loss_curve")
    plt.close(fig)


def write_samples(ctx, s: Samples, model, tok, device) -> None:
    g = torch.Generator().manual_seed(ctx.seed)
    lines = [f"# Samples from gpt_train:{ctx.cell}\n", f"{WHITESPACE_NOTE}\n"]
    for prompt in s.prompts:
        ids = torch.tensor([tok(prompt)["input_ids"] or [tok.eos_token_id]], device=device)
        ways = {
            "greedy": generate(model, ids, s.max_new_tokens, eos_token_id=tok.eos_token_id),
            f"sample T={s.temperature} top_k={s.top_k} top_p={s.top_p}": generate(
                model,
                ids,
                s.max_new_tokens,
                do_sample=True,
                temperature=s.temperature,
                top_k=s.top_k,
                top_p=s.top_p,
                eos_token_id=tok.eos_token_id,
                generator=g,
            ),
            f"beam {s.num_beams}": beam_search(
                model, ids, s.num_beams, s.max_new_tokens, eos_token_id=tok.eos_token_id
            )[0],
        }
        lines.append(f"## Prompt: {prompt!r}\n")
        for name, seq in ways.items():
            lines.append(f"**{name}**\n\n```\n{visible(tok.decode(seq[0].tolist()))}\n```\n")
    ctx.log_text("\n".join(lines), "samples.md")


def start_from(ctx: StageRun, p: GptTrainConfig, model) -> dict:
    """Fine-tuning: load the init_from cell's checkpoint into `model`, then put LoRA on it (p.lora).
    Returns the parameter counts the cell reports."""
    if p.init_from:
        ckpt = Path(ctx.inputs["base"]).parent / "ckpt.pt"
        if not ckpt.exists():
            raise InputError(f"{ckpt} does not exist; fix: rerun gpt_train cell {p.init_from!r} (init_from)")
        try:
            model.load_state_dict(read_checkpoint(ckpt)["model"])
        except RuntimeError as exc:
            raise InputError(
                f"{ckpt} does not fit this cell's model ({str(exc).splitlines()[0]}); fix: give gpt_train cell "
                f"{ctx.cell!r} the model section of {p.init_from!r}"
            ) from None
    total = sum(q.numel() for q in model.parameters())
    if p.lora:
        lora = p.lora  # a cell's `lora: {r: 4}` is filled with the schema's other defaults (steps.config)
        try:
            apply_lora(model, lora["r"], lora["alpha"], lora["targets"], lora["dropout"])
        except ValueError as exc:
            raise InputError(f"gpt_train.lora.targets: {exc}; fix: name modules of the GPT (q_proj, c_fc, ...)")
    trainable = sum(q.numel() for q in model.parameters() if q.requires_grad)
    return {"trainable_params": trainable, "trainable_fraction": trainable / total}


def optimizer_state(ctx: StageRun, model) -> dict:
    """AdamW's state bytes as saved in the final checkpoint (measured) against 2 moments per trainable
    element + a step count per tensor (analytic)."""
    measured = optimizer_state_bytes(read_checkpoint(ctx.out / "ckpt.pt")["optimizer"]["state"])
    return {"optimizer_state_bytes": measured, "optimizer_state_bytes_analytic": adamw_state_bytes_analytic(model)}


def run(ctx: StageRun) -> dict:
    p, device = GptTrainConfig.of(ctx.params), ctx.device
    tok, train_data, val_data = load_data(
        p.model.block_size, p.max_train_tokens, ctx.seed, ctx.inputs["corpus"], ctx.inputs["tokenizer"]
    )
    cfg = model_config(p, tok)
    torch.manual_seed(ctx.seed)
    model = GPTLMHeadModel(cfg).to(device)
    n_params = model.num_params()
    counts = start_from(ctx, p, model)
    print(f"model: {n_params / 1e6:.2f} M non-embedding params, {len(train_data.tokens)} train tokens")
    val0 = evaluate(model, val_data, p.batch_size, p.eval_batches, device, p.amp)

    tok.save_pretrained(str(ctx.out / "tokenizer"))
    extra = {
        "fingerprint": p.fingerprint(),
        "config": cfg.__dict__,
        "tokenizer": "tokenizer",
        "seed": ctx.seed,
    }
    state = train(
        model,
        train_data,
        val_data,
        p,
        device,
        ctx.out / "ckpt.pt",
        extra,
        log=ctx.log_metrics,
        progress=lambda it, **kw: ctx.progress(it, desc="train", **kw),
        stop_after=p.stop_after_steps,
    )
    (ctx.out / "history.json").write_text(json.dumps(state.history))
    plot_curves(ctx, state.history)

    peaks = {
        dt: peak_flops(dt, device)  # measured once a dtype, this run (the bench's fp32 is training's too)
        for dt in dict.fromkeys([matmul_dtype(p.amp), *([] if ctx.extra_seed else bench_dtypes(ctx, p.bench, device))])
    }
    fpt = flops_per_token(n_params, cfg.n_layer, cfg.n_embd, cfg.block_size)
    tokens_s = state.tokens / state.train_time_s if state.train_time_s else float("nan")
    val_final = [h["val_loss"] for h in state.history if "val_loss" in h][-1:] or [float("nan")]
    out = {
        "n_params_non_embedding": n_params,
        "steps": state.step,
        "val_loss_initial": val0,
        "val_loss_final": val_final[0],
        "val_ppl_final": math.exp(val_final[0]),
        "val_loss_drop": val0 - val_final[0],
        "train_loss_final": state.history[-1]["train_loss"] if state.history else float("nan"),
        "tokens_per_s": tokens_s,
        "flops_per_token": fpt,
        **mfu(tokens_s * fpt, peaks[matmul_dtype(p.amp)]),
        **{f"matmul_peak_{k}": v["measured"] for k, v in peaks.items()},
        "train_tokens": len(train_data.tokens),
        "val_tokens": len(val_data.tokens),
        **counts,
        **optimizer_state(ctx, model),
    }
    print(f"val loss {val0:.3f} -> {val_final[0]:.3f}; {tokens_s:.0f} tokens/s, MFU {out['mfu']:.1%}")
    if ctx.extra_seed:  # a seed group's further seed (steps/core/job.py): its training outcomes only;
        (ctx.out / "ckpt.pt").unlink(missing_ok=True)  # the samples, model, export and bench are the first seed's
        return out
    if p.lora:
        merge_lora(model)  # plain Linears holding W + s·B·A: the samples, the HF export and chat read it as any GPT
    write_samples(ctx, p.samples, model, tok, device)
    out.update(export_cell(ctx, model, tok))  # <cell>/hf/ + the run's MLflow model
    if p.bench.enabled:
        out.update(run_benchmark(ctx, p, cfg, peaks, device))
    ctx.log_artifact(ctx.out / "history.json")
    return out


STAGE = Stage.of(__spec__.name, run, SHOWN)

if __name__ == "__main__":
    STAGE.main()
