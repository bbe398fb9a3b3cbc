"""The real model at its real size, with nothing allocated: built under a FakeTensorMode (every
tensor has a shape, a dtype and a storage identity, no data), and how the simulated rank trains it
(Recipe: mixed precision, optimizer, loss). It is parallelized by the sharding stage's own path,
steps/sharding/native/parallelize.py (apply_tp, apply_ep, apply_fsdp; fakeworld.parallelized), the
Recipe's FSDP2 policy (bf16 compute with fp32 gradient reduction at scale) a parameter there.

  llama  HF LlamaForCausalLM(LlamaConfig(...)), torchtitan's TP plan (parallelize.llama_tp_plan)
  gpt2   our GPT (steps/models/gpt.py), the TP plan the sharding stage runs on gloo; embeddings
         and the tied head stay replicated under TP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from steps.models.gpt import GPTConfig, GPTLMHeadModel
from steps.models.shapes import Shape
from steps.sharding.native.parallelize import NO_MIXED_PRECISION

MIXED = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


@dataclass(frozen=True)
class Recipe:
    """How the simulated rank is built and trained. The default is the scale stage's (torchtitan's):
    bf16 compute with fp32 gradient reduction, AdamW, the loss on the logits (loss-parallel under
    TP). The sharding stage's gloo cells (steps/scale/replay_sharding.py) train our GPT in fp32 without a
    mixed-precision policy, with their own optimizer, on the model's own loss (labels=ids).

    reshard  FSDP2 reshard_after_forward: False keeps each layer's gathered parameters from forward
             to backward (one all-gather a step instead of two: ZeRO-2's communication)
    sp       sequence parallel (our GPT only: the sharding stage's SequenceParallel plan)
    gpt      our GPT's options beyond the shape (GPTConfig fields: mlp, bias, norm, pos, ...);
             `checkpoint_activations` there recomputes each block in backward"""

    mixed: bool = True
    optimizer: str = "adamw"  # adamw | adam | sgd (momentum 0.9)
    own_loss: bool = False
    reshard: bool = True
    sp: bool = False
    dtype: str = "float32"
    gpt: dict = field(default_factory=dict)

    def optimizer_for(self, params):
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=1e-4, momentum=0.9, foreach=False)
        cls = torch.optim.AdamW if self.optimizer == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-4, foreach=False)


SCALE = Recipe()


def build(shape: Shape, layers: int | None = None, recipe: Recipe = SCALE):
    """The module (call it under the FakeTensorMode that should own its tensors)."""
    n = shape.layers if layers is None else layers
    if shape.experts:  # MoE: our GPT of the named shape (steps/models/shapes.py), its moe settings included
        from steps.models.shapes import shape as named

        return GPTLMHeadModel(named(shape.named, n_layer=n, **recipe.gpt))
    sizes = dict(
        vocab_size=shape.vocab, block_size=shape.max_seq, n_layer=n, n_head=shape.heads, n_embd=shape.d,
        n_kv_head=shape.kv_heads, mlp_hidden=shape.ffn,
    )  # fmt: skip
    if shape.family == "llama":  # HF's own module, its config the one our Llama options convert to
        from transformers import LlamaForCausalLM  # Llama cells only: transformers costs a gpt2 job ~2 s

        from steps.models.llama_convert import hf_config_from_ours  # (imports transformers)

        llama = GPTConfig(**sizes, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_weights=False)
        cfg = hf_config_from_ours(llama)
        cfg._attn_implementation = "sdpa"
        return LlamaForCausalLM(cfg)
    cfg = GPTConfig(**sizes, **recipe.gpt)
    model = GPTLMHeadModel(cfg)
    return model if recipe.dtype == "float32" else model.to(getattr(torch, recipe.dtype))


def policy(recipe: Recipe = SCALE) -> MixedPrecisionPolicy:
    """The FSDP2 mixed-precision policy parallelize.apply_fsdp / apply_ep are given."""
    return MIXED if recipe.mixed else NO_MIXED_PRECISION


def loss_of(model, ids: torch.Tensor, recipe: Recipe = SCALE) -> torch.Tensor:
    """Next-token cross-entropy in fp32 (loss-parallel when the logits are vocabulary-sharded), or
    the model's own loss (our GPT with labels=ids, as the sharding stage's cells train it)."""
    if recipe.own_loss:
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss
    out = model(ids)
    logits = out.logits
    aux = getattr(out, "aux_loss", None)  # MoE: the load-balancing loss (GPTLMHeadModel), coefficient applied
    aux = 0.0 if aux is None else model.config.moe["aux_loss_coef"] * aux
    flat = logits.flatten(0, 1).float()
    labels = ids.flatten()
    if isinstance(logits, DTensor):
        with loss_parallel():
            loss = F.cross_entropy(flat, labels) + aux
            loss.backward()
        return loss
    loss = F.cross_entropy(flat, labels) + aux
    loss.backward()
    return loss
