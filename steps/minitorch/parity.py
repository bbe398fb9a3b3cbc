"""Every op of the engine against torch autograd in float64: forward values and the gradient of
sum(out * cotangent) with respect to each input. Used by the tests (hypothesis draws the shapes) and
by the `minitorch` stage (`op_parity_err_max`, one fixed draw per backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from . import nn
from .tensor import tensor


@dataclass(frozen=True)
class Op:
    arity: int  # 1, or 2 for ops whose inputs broadcast
    ours: Callable  # on miniTorch tensors
    theirs: Callable  # on torch tensors
    domain: str = "any"  # "any" in [-2, 2] | "positive" in [0.1, 2] | "away" |x| in [0.5, 2]
    min_dims: int = 0  # e.g. 2 for matmul, 1 for reductions along dim -1
    grad: bool = True  # LT/EQ have none


T = torch
OPS: dict[str, Op] = {
    "neg": Op(1, lambda a: -a, lambda a: -a),
    "exp": Op(1, lambda a: a.exp(), T.exp),
    "log": Op(1, lambda a: a.log(), T.log, "positive"),
    "inv": Op(1, lambda a: a.inv(), T.reciprocal, "away"),
    "relu": Op(1, lambda a: a.relu(), T.relu, "away"),
    "sigmoid": Op(1, lambda a: a.sigmoid(), T.sigmoid),
    "tanh": Op(1, lambda a: a.tanh(), T.tanh),
    "erf": Op(1, lambda a: a.erf(), T.erf),
    "gelu": Op(1, nn.gelu, T.nn.functional.gelu),
    "gelu_tanh": Op(1, lambda a: nn.gelu(a, "tanh"), lambda a: T.nn.functional.gelu(a, approximate="tanh")),
    "pow3": Op(1, lambda a: a**3, lambda a: a**3),
    "pow_half": Op(1, lambda a: a**0.5, lambda a: a**0.5, "positive"),
    "sum": Op(1, lambda a: a.sum(), T.sum),
    "sum_last": Op(1, lambda a: a.sum(-1), lambda a: a.sum(-1), min_dims=1),
    "mean_first": Op(1, lambda a: a.mean(0), lambda a: a.mean(0), min_dims=1),
    "max_last": Op(1, lambda a: a.max(-1), lambda a: a.max(-1).values, min_dims=1),
    "permute": Op(
        1, lambda a: a.permute(*reversed(range(a.dims))) * 1.5, lambda a: a.permute(*reversed(range(a.dim()))) * 1.5
    ),
    "view": Op(1, lambda a: a.view(-1) * 2.0, lambda a: a.reshape(-1) * 2.0),
    "softmax": Op(1, lambda a: nn.softmax(a, -1), lambda a: T.softmax(a, -1), min_dims=1),
    "logsumexp": Op(1, lambda a: nn.logsumexp(a, -1), lambda a: T.logsumexp(a, -1), min_dims=1),
    "add": Op(2, lambda a, b: a + b, lambda a, b: a + b),
    "sub": Op(2, lambda a, b: a - b, lambda a, b: a - b),
    "mul": Op(2, lambda a, b: a * b, lambda a, b: a * b),
    "div": Op(2, lambda a, b: a / b, lambda a, b: a / b, "away"),
    "lt": Op(2, lambda a, b: a < b, lambda a, b: (a < b).double(), grad=False),
    "eq": Op(2, lambda a, b: a == b, lambda a, b: (a == b).double(), grad=False),
    "matmul": Op(2, lambda a, b: a @ b, lambda a, b: a @ b, min_dims=2),
}


def sample(rng: np.random.Generator, shape, domain: str) -> np.ndarray:
    if domain == "positive":
        return rng.uniform(0.1, 2.0, shape)
    if domain == "away":
        return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    return rng.uniform(-2.0, 2.0, shape)


def check_op(name: str, inputs: list[np.ndarray], backend="reference", seed: int = 0) -> dict[str, float]:
    """Largest |ours - torch| of the forward values and of each input's gradient (float64)."""
    op = OPS[name]
    ours_in = [tensor(x, requires_grad=op.grad, backend=backend) for x in inputs]
    theirs_in = [torch.tensor(x, dtype=torch.float64, requires_grad=op.grad) for x in inputs]
    ours, theirs = op.ours(*ours_in), op.theirs(*theirs_in)
    errors = {"forward": float(np.max(np.abs(ours.to_numpy() - theirs.detach().numpy()), initial=0.0))}
    if op.grad:
        cotangent = np.random.default_rng(seed).uniform(-1.0, 1.0, theirs.shape)
        (ours * tensor(cotangent, backend=backend)).sum().backward()
        (theirs * torch.tensor(cotangent)).sum().backward()
        for i, (a, b) in enumerate(zip(ours_in, theirs_in)):
            ga = np.zeros(a.shape) if a.grad is None else a.grad.to_numpy()
            errors[f"grad{i}"] = float(np.max(np.abs(ga - b.grad.numpy()), initial=0.0))
    return errors


# one fixed draw per op for the stage: broadcasting on the binary ops, a batch-broadcast matmul
STAGE_SHAPES = {1: [(3, 4, 5)], 2: [(3, 1, 5), (4, 1)]}
MATMUL_SHAPES = [(2, 3, 4), (4, 5)]


def op_parity(backend: str = "reference", seed: int = 0) -> dict[str, float]:
    """Worst error (forward or any gradient) per op on the stage's fixed shapes."""
    rng = np.random.default_rng(seed)
    worst = {}
    for name, op in OPS.items():
        shapes = MATMUL_SHAPES if name == "matmul" else STAGE_SHAPES[op.arity]
        inputs = [sample(rng, s, op.domain) for s in shapes]
        worst[name] = max(check_op(name, inputs, backend, seed).values())
    return worst
