"""The single-device references every sharded run is checked against: the same weights, the
same global batches, one process, the plan's optimizer (parity.max_delta compares the states).

  mlp_reference         the toy MLP (torch_scratch cells, and the torch side of JAX MLP cells)
  gpt_blocks_reference  our GPT's blocks on an MSE target (the torch side of JAX GPT cells)
  moe_blocks_reference  x + MoE(x) blocks (models/moe.py) on an MSE target (the torch side of JAX EP)
  gpt_reference         the whole GPT through gpt_train's TrainStep (torch_native cells; its loss
                        at the model's precision: fp64 for fp64)
The MLP and the blocks share one loop, single_device(); the GPT runs the one training step that gpt_train
and perf use (no clipping: the sharded engines do not clip).
"""

from __future__ import annotations

import torch

from steps.models.gpt import Block, GPTConfig
from steps.models.moe import MoE
from steps.models.train_step import StepOptions, TrainStep
from steps.sharding.gpt_init import full_model, gpt_batch
from steps.sharding.plan import Plan
from steps.sharding.toy_mlp import MLP, loss_fn
from steps.sharding.toy_mlp_init import make_batch

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def single_device(plan: Plan, model: torch.nn.Module, batches, state) -> tuple[list, list, dict]:
    """K optimizer steps of `model` on (x, y) batches with an MSE loss. `state(kind)` names the
    'param' or 'grad' tensors. Returns per-step losses and gradients, and the final parameters."""
    opt = plan.optimizer_for(model.parameters())
    losses, grads = [], []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        losses.append(loss.item())
        grads.append(state("grad"))
        opt.step()
    return losses, grads, state("param")


def mlp_reference(plan: Plan, full: dict[str, torch.Tensor], dtype) -> tuple[list, list, dict]:
    model = MLP(full)
    batches = [
        [torch.tensor(a, dtype=dtype) for a in make_batch(plan.batch_size, plan.mlp.dim, plan.seed, step)]
        for step in range(plan.steps)
    ]
    return single_device(plan, model, batches, model.full_state)


class Residual(torch.nn.Module):
    """x + mlp(x): the JAX MoE blocks' layer (steps/sharding/jax/moe_blocks.py) around a torch MoE."""

    def __init__(self, mlp: torch.nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(x)


def blocks_reference(plan: Plan, blocks: torch.nn.Module, weights: dict, batches: list) -> tuple[list, dict]:
    """torch `blocks` (a Sequential) loaded with `weights` (numpy, "transformer.h.<i>.<name>"),
    trained on the numpy `batches` with an MSE loss: per-step losses, final parameters as numpy."""
    dtype = DTYPES[plan.dtype]
    blocks = blocks.to(dtype)
    prefix = "transformer.h."
    blocks.load_state_dict({k[len(prefix) :]: torch.tensor(v, dtype=dtype) for k, v in weights.items()})

    def state(kind):
        return {prefix + k: (p if kind == "param" else p.grad).detach() for k, p in blocks.named_parameters()}

    losses, _, params = single_device(plan, blocks, [[torch.tensor(a, dtype=dtype) for a in b] for b in batches], state)
    return losses, {k: v.numpy() for k, v in params.items()}


def gpt_blocks_reference(plan: Plan, weights: dict, batches: list) -> tuple[list, dict]:
    """steps/models/gpt.py Blocks (the torch side of the JAX GPT-block cells)."""
    cfg = GPTConfig(**plan.gpt, dropout=0.0)
    return blocks_reference(plan, torch.nn.Sequential(*(Block(cfg) for _ in range(cfg.n_layer))), weights, batches)


def moe_blocks_reference(plan: Plan, weights: dict, batches: list) -> tuple[list, dict]:
    """x + MoE(x) per layer with steps/models/moe.py's MoE (itself checked against HF Mixtral,
    tests/test_moe.py) on one device: the torch side of the JAX expert-parallel cell. Its
    load-balancing loss is left out, as the JAX blocks have none; no capacity (nothing dropped)."""
    cfg = GPTConfig(**plan.gpt, dropout=0.0)
    return blocks_reference(
        plan, torch.nn.Sequential(*(Residual(MoE(cfg)) for _ in range(cfg.n_layer))), weights, batches
    )


def gpt_reference(plan: Plan, dtype) -> tuple[list, list, dict]:
    """The GPT on one device through TrainStep with the plan's optimizer: per-step losses and
    gradients, final parameters."""
    model = full_model(plan, dtype)
    ts = TrainStep(
        model, torch.get_default_device(), StepOptions(grad_clip=0.0), optimizer=plan.optimizer_for(model.parameters())
    )
    losses, grads = [], []

    def record_grads(label):
        if label == "after backward":
            grads.append({k: p.grad.detach().clone() for k, p in model.named_parameters()})

    for step in range(plan.steps):
        loss, _ = ts.step([gpt_batch(plan, step)], probe=record_grads)
        losses.append(loss)
    return losses, grads, {k: p.detach().clone() for k, p in model.named_parameters()}
