"""The MCQ stages' sections as dataclasses: prepare_mcq's and mcq_finetune's knobs. Defaults:
the schemas (workflow/schemas/<stage>.schema.yaml), filled in before the dataclass is built; the
dict stays what the job logs and hashes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from steps.config.typed import Section


@dataclass(frozen=True, kw_only=True)
class PrepareMcqConfig(Section):
    """prepare_mcq's resolved section."""

    source: str  # builtin:elements | a Kaggle CSV | a Kaggle folder | hf:<path>[:<name>]
    val_fraction: float
    test_fraction: float
    templates: list[str]  # builtin:elements templates; [] = all
    context_facts: int  # facts in each builtin context
    distractor_pool: int
    max_questions: int  # hf: sources only; 0 = all rows


@dataclass(frozen=True, kw_only=True)
class McqFinetuneConfig(Section):
    """One mcq_finetune cell's resolved section."""

    data: str | None  # a Kaggle folder (None = the prepare_mcq rule's)
    val_fraction: float  # carved from train.csv when the folder has no validation.csv
    backbone: str
    allow_hub: bool
    pooling: Literal["cls", "mean"]
    dropout: float | None  # every dropout rate of the backbone; None = the checkpoint's
    train: bool  # False = zero-shot
    use_context: bool
    max_length: int
    epochs: float
    max_steps: int  # 0 = full epochs
    batch_size: int
    eval_batch_size: int
    grad_accum: int
    lr: float
    weight_decay: float
    warmup_ratio: float
    precision: Literal["auto", "fp32", "bf16", "fp16"]
    group_by_length: bool
    logging_steps: int
    max_train: int  # 0 = all
    max_eval: int  # 0 = all
    peak_matmul_size: int
    bootstrap: int
    keep_checkpoint: bool
