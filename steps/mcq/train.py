"""Trainer glue: datasets from the CSV splits, the MLflow bridge, throughput, best checkpoint.

MLflow: the job's run is created by StageRun through MlflowClient and is never the fluent
"active run", so HF's MLflowCallback would open a second run. We use report_to="none" and a
TrainerCallback that forwards Trainer logs to ctx.log_metrics: exactly one run per job.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from datasets import Dataset, DatasetDict
from transformers import Trainer, TrainerCallback, TrainingArguments

from steps.mcq.config import McqFinetuneConfig
from steps.mcq.features import preprocess
from steps.models.hf_export import readable_like_config

os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")  # belt and braces: no auto MLflow runs


def to_datasets(splits: dict[str, pd.DataFrame], tokenizer, use_context: bool, max_length: int, limits: dict[str, int]):
    """(DatasetDict of tokenized splits, the rows each holds) from validated CSV frames (Dataset.map,
    batched). Evaluation splits are sorted by length: Trainer pads every eval batch to its longest
    pair, and in CSV order that is ~1.5x the mean. The returned rows are in the dataset's order
    and keep the CSV row number as index (write_submission restores the CSV order)."""
    out, rows = {}, {}
    for name, df in splits.items():
        if limits.get(name):
            df = df.head(limits[name])
        ds = Dataset.from_pandas(df.reset_index(drop=True), preserve_index=False)
        ds = ds.map(
            preprocess,
            batched=True,
            remove_columns=ds.column_names,
            fn_kwargs={"tokenizer": tokenizer, "use_context": use_context, "max_length": max_length},
            desc=f"tokenize {name}",
        )
        if name != "train":
            order = np.argsort(ds["length"], kind="stable")
            ds, df = ds.select(order), df.iloc[order]
        out[name], rows[name] = ds, df
    return DatasetDict(out), rows


def sync_if_cuda(model) -> None:
    """Wait for the work queued on the model's GPU. CUDA kernels run asynchronously: without this
    a clock read at the end of a step sees when its kernels were launched, not when they ran, and
    one read at its start charges the previous evaluation's tail to the step. No-op on the CPU."""
    if model is None or not torch.cuda.is_available():
        return
    device = getattr(model, "device", None)  # HF models have one; else the first parameter's
    if not isinstance(device, torch.device):
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_dtype(precision: str) -> str:
    """The dtype the Trainer's matmuls run in for a resolved precision (fp32 | fp16 | bf16): the
    MFU denominator is that dtype's matmul peak (fp16/bf16 tensor cores are ~15x fp32 on an H100)."""
    try:
        return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[precision]
    except KeyError:
        raise ValueError(f"precision {precision!r}: expected fp32, fp16 or bf16") from None


class Throughput(TrainerCallback):
    """Wall time of optimizer steps only (no evaluation or checkpointing in it); on a GPU the
    clock is read after the queued work has finished (sync_if_cuda)."""

    def __init__(self):
        self.step_time, self.t0 = 0.0, None

    def on_step_begin(self, args, state, control, model=None, **kw):
        sync_if_cuda(model)
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kw):
        sync_if_cuda(model)
        self.step_time += time.perf_counter() - self.t0


class ToStageRun(TrainerCallback):
    """Trainer logs (loss, lr, eval_map3 ...) -> the job's own MLflow run, step = global step."""

    def __init__(self, ctx):
        self.ctx = ctx

    def on_log(self, args, state, control, logs=None, **kw):
        numeric = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        self.ctx.log_metrics(numeric, step=state.global_step)


class CountingTrainer(Trainer):
    """Counts examples and padded tokens the training steps really processed (for MFU)."""

    examples = 0
    tokens = 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.examples += inputs["input_ids"].shape[0]
        self.tokens += inputs["input_ids"].numel()
        return super().training_step(model, inputs, num_items_in_batch)


# bf16 autocast on a CPU pays where its matmuls run this many times fp32's: measured 2.15x on the
# AVX512-BF16 EPYC (512^3, one thread), ~0.01x through the scalar fallback of an AVX2-only CPU
CPU_BF16_PAYS = 1.25
PROBE_N = 512  # 256^3 (~0.3 ms) once read 1.9x-3.1x on the same host; 512^3 (~1.5 ms) 2.14x-2.18x


def resolve_precision(precision: str, device) -> tuple[str, str]:
    """(precision, how it was chosen). `auto`: bf16 AMP on CUDA (fp16 without bf16); on a CPU, bf16
    AMP where a probe matmul in bf16 runs at least CPU_BF16_PAYS times the fp32 one
    (hardware.native_matmul, one thread), else fp32: without AVX512-BF16/AMX, bf16 autocast ran 13x
    slower than fp32 (the AVX2-only EPYC)."""
    if precision != "auto":
        return precision, "asked for"
    if device.type == "cuda":
        return ("bf16", "auto: CUDA with bf16") if torch.cuda.is_bf16_supported() else ("fp16", "auto: CUDA, no bf16")
    from steps.hardware import native_matmul

    _, bf16, fp32 = native_matmul("bfloat16", device.type, n=PROBE_N)
    chosen = "bf16" if bf16 >= CPU_BF16_PAYS * fp32 else "fp32"
    return chosen, f"auto: probe {PROBE_N}^3 bf16 {bf16 / 1e9:.0f} vs fp32 {fp32 / 1e9:.0f} GFLOP/s, 1 thread"


def training_args(p: McqFinetuneConfig, out: Path, seed: int, device, train: bool):
    cuda = device.type == "cuda"
    precision, chosen = resolve_precision(p.precision, device)
    return (
        TrainingArguments(
            output_dir=str(out / "checkpoints"),
            seed=seed,
            data_seed=seed,
            use_cpu=not cuda,
            num_train_epochs=p.epochs,
            max_steps=p.max_steps if p.max_steps > 0 else -1,
            per_device_train_batch_size=p.batch_size,
            per_device_eval_batch_size=p.eval_batch_size,
            gradient_accumulation_steps=p.grad_accum,
            learning_rate=p.lr,
            weight_decay=p.weight_decay,
            warmup_steps=p.warmup_ratio,
            lr_scheduler_type="linear",
            optim="adamw_torch",
            bf16=precision == "bf16",
            fp16=precision == "fp16",
            eval_strategy="epoch" if train else "no",
            save_strategy="epoch" if train else "no",
            save_only_model=True,
            save_total_limit=1,
            load_best_model_at_end=train,
            metric_for_best_model="map3",
            greater_is_better=True,
            logging_strategy="steps",
            logging_steps=p.logging_steps,
            logging_first_step=True,
            report_to="none",
            disable_tqdm=False,
            dataloader_num_workers=0,
            remove_unused_columns=False,
            train_sampling_strategy="group_by_length" if p.group_by_length else "random",
        ),
        precision,
        chosen,
    )


def keep_only_best(trainer, out: Path) -> Path:
    """Save the (best, loaded at end) model once under out/best and drop epoch checkpoints."""
    best = out / "best"
    trainer.save_model(str(best))
    readable_like_config(best)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return best
