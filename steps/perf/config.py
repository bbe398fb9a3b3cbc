"""The perf section as a dataclass: the step's knobs are StepOptions' fields and the model's
GPTConfig's (declared there, once); here only what perf adds. Defaults: the schema
(workflow/schemas/perf.schema.yaml), filled in before the dataclass is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from steps.config.typed import TRAJECTORY, typed
from steps.models.gpt import GPTConfig
from steps.models.train_step import StepOptions


@dataclass(kw_only=True)
class PerfModel(GPTConfig):
    """perf.model: GPTConfig's knobs plus how the cell builds the model."""

    pad_vocab_multiple: int  # embedding/LM-head rows rounded up to a multiple (the data keeps vocab_size)
    fp8: bool  # fp8 matmuls in the blocks' linears (steps/models/fp8.py)


@dataclass(frozen=True, kw_only=True)
class PerfConfig(StepOptions):
    """One perf cell's resolved section (StepOptions' fields: the step's knobs)."""

    desc: str
    model: PerfModel = field(metadata=TRAJECTORY)
    batch_size: int = field(metadata=TRAJECTORY)
    data_batches: int = field(metadata=TRAJECTORY)
    warmup_steps: int = field(metadata=TRAJECTORY)
    timed_steps: int = field(metadata=TRAJECTORY)
    skip_slow_amp: bool
    attn: Literal["sdpa", "manual"] = GPTConfig.attn  # model knobs the perf section keeps at its top level
    checkpoint_activations: bool = GPTConfig.checkpoint_activations
    fused_softmax: bool
    fused_layernorm: bool
    fused_backend: Literal["auto", "triton", "compiled", "eager"]
    peak_matmul_size: int
    baseline_cell: str
    timeline_cell: str

    @classmethod
    def of(cls, params) -> "PerfConfig":
        """A resolved perf section (dict) as its dataclass."""
        return typed(cls, params)
