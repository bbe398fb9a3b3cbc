"""The gpt_train section as a dataclass: the step's knobs are StepOptions' fields and the
model's GPTConfig's (declared there, once); here only what the training run adds. Defaults: the
schema (workflow/schemas/gpt_train.schema.yaml), filled in before the dataclass is built."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Literal

from steps.config import config_hash
from steps.config.typed import typed
from steps.models.gpt import GPTConfig
from steps.models.train_step import StepOptions

# field metadata: what the run reports and when it saves, not what it trains (a checkpoint
# written under another value still resumes)
NOT_TRAINED = {"trained": False}


@dataclass(frozen=True, kw_only=True)
class Samples:
    prompts: list[str]
    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    num_beams: int


@dataclass(frozen=True, kw_only=True)
class Bench:
    enabled: bool
    dtypes: list[Literal["float32", "bfloat16", "float16"]]  # the matmul dtypes its metrics are named by
    pairs: int
    steps_per_pair: int
    warmup: int


@dataclass(frozen=True, kw_only=True)
class GptTrainConfig(StepOptions):
    """gpt_train's resolved section (StepOptions' fields: the step's knobs; model.vocab_size None
    = the tokenizer's size)."""

    model: GPTConfig
    batch_size: int
    max_steps: int
    min_lr_ratio: float
    warmup_steps: int
    max_train_tokens: int | None
    init_from: str | None  # a gpt_train cell whose ckpt.pt this one fine-tunes (None: from scratch)
    lora: dict | None  # {r, alpha, dropout, targets}: steps/models/lora.py; None = every weight trains
    eval_interval: int = field(metadata=NOT_TRAINED)
    eval_batches: int = field(metadata=NOT_TRAINED)
    ckpt_interval: int = field(metadata=NOT_TRAINED)
    resume: bool = field(metadata=NOT_TRAINED)
    stop_after_steps: int | None = field(metadata=NOT_TRAINED)
    samples: Samples = field(metadata=NOT_TRAINED)
    bench: Bench = field(metadata=NOT_TRAINED)

    @classmethod
    def of(cls, params) -> "GptTrainConfig":
        """A resolved gpt_train section (dict) as its dataclass."""
        return typed(cls, params)

    def fingerprint(self) -> str:
        """What a checkpoint must have been trained with to resume this run: every field that
        is not NOT_TRAINED."""
        values = asdict(self)
        return config_hash({f.name: values[f.name] for f in fields(self) if f.metadata.get("trained", True)})
