"""The minitorch section as a dataclass (defaults: workflow/schemas/minitorch.schema.yaml, filled in
before it is built). The gpt and translate cells' models are GPT-2s of steps/models/gpt.py: their
model knobs are GPTConfig's (declared there, once); here only what each cell adds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from steps.config.typed import Section
from steps.models.gpt import GPTConfig


@dataclass(kw_only=True)
class MinitorchGpt(GPTConfig):
    """minitorch.gpt: GPTConfig's knobs (the vocabulary: the lab tokenizer's) plus the cell's run."""

    batch_size: int
    max_tokens: int  # train tokens read from the corpus
    train_steps: int  # AdamW steps on both engines from the same init
    lr: float
    weight_decay: float
    parity_tol: float  # logits and every gradient vs torch, fp64
    trajectory_tol: float  # largest loss difference over the steps
    pairs: int  # interleaved step pairs vs torch eager
    vs_reference_pairs: int  # interleaved pairs vs the reference backend; 0 = skip


@dataclass(frozen=True, kw_only=True)
class MinitorchClassifier:
    """minitorch.classifier: a passage's bag of tokens -> its play's genre."""

    passage_tokens: int
    max_passages: int  # per split
    hidden: int
    dropout: float
    epochs: int
    batch_size: int
    lr: float


@dataclass(kw_only=True)
class MinitorchTranslate(GPTConfig):
    """minitorch.translate: GPTConfig's knobs (vocab_size: the BPE vocabulary trained on the pairs)
    plus the data, the training and the decoding."""

    source: str  # hf:<dataset>:<config>, or a TSV of german<TAB>english lines
    max_pairs: int
    test_pairs: int
    steps: int
    batch_size: int
    lr: float
    max_new_tokens: int


@dataclass(frozen=True, kw_only=True)
class MinitorchConfig(Section):
    """One minitorch cell's resolved section: a model (kind) on a kernel backend."""

    kind: Literal["ops", "gpt", "classifier", "translate"]
    backend: Literal["reference", "fast", "cuda"]
    op_tol: float  # ops vs torch autograd, fp64
    matmul_size: int
    matmul_pairs: int
    peak_matmul_size: int
    job_threads: int  # cores Snakemake reserves for the cell's job and torch's threads in it (0 = the global threads)
    gpt: MinitorchGpt
    classifier: MinitorchClassifier
    translate: MinitorchTranslate
