"""Our GPT (steps/models/gpt.py) as the torch sharding engines and the single-device reference
build it: same seed -> same weights on every rank, same global batches. The training loss is the
model's own (causal_lm_loss: fp64 for an fp64 model, so fp64 cells compare fp64 losses)."""

from __future__ import annotations

import numpy as np
import torch

from steps.models.gpt import GPTConfig, GPTLMHeadModel
from steps.sharding.plan import Plan


def gpt_config(plan: Plan) -> GPTConfig:
    """Untied head under PP: wte and lm_head live on different stages."""
    return GPTConfig(**plan.gpt, dropout=0.0, tie_weights=not plan.pipelined)


def full_model(plan: Plan, dtype) -> GPTLMHeadModel:
    """The single-device model every engine starts from (same seed -> same weights)."""
    torch.manual_seed(plan.seed)
    return GPTLMHeadModel(gpt_config(plan)).to(dtype)


def gpt_batch(plan: Plan, step: int) -> torch.Tensor:
    rng = np.random.default_rng([plan.seed, step])
    return torch.tensor(rng.integers(0, plan.gpt["vocab_size"], (plan.batch_size, plan.gpt["block_size"])))


def param_shapes(model) -> dict[str, int]:
    return {k: p.numel() for k, p in model.named_parameters()}
