"""Modules and parameters (miniTorch's `module.py`, and the layers of assignment 2's `modules_basic.py`)."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from . import nn
from .tensor import Tensor, as_ids, as_index, tensor


class Parameter:
    """A trainable leaf tensor held by a module; `update` swaps in a new value (optimizers)."""

    def __init__(self, value: Tensor):
        self.value = value
        self.value.requires_grad = True

    def update(self, value: Tensor) -> None:
        self.value = value
        self.value.requires_grad = True

    def __repr__(self) -> str:
        return f"Parameter(shape={self.value.shape})"


class Module:
    def __init__(self):
        self.__dict__["_modules"] = {}
        self.__dict__["_parameters"] = {}
        self.training = True

    def __setattr__(self, key, value):
        if isinstance(value, Parameter):
            self.__dict__["_parameters"][key] = value
        elif isinstance(value, Module):
            self.__dict__["_modules"][key] = value
        else:
            super().__setattr__(key, value)

    def __getattr__(self, key):
        for table in ("_parameters", "_modules"):
            if key in self.__dict__.get(table, {}):
                return self.__dict__[table][key]
        raise AttributeError(f"{type(self).__name__} has no attribute {key!r}")

    def modules(self) -> Iterator[Module]:
        yield self
        for child in self._modules.values():
            yield from child.modules()

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        for name, p in self._parameters.items():
            yield prefix + name, p
        for name, child in self._modules.items():
            yield from child.named_parameters(f"{prefix}{name}.")

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def train(self) -> Module:
        for m in self.modules():
            m.training = True
        return self

    def eval(self) -> Module:
        for m in self.modules():
            m.training = False
        return self

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class ModuleList(Module):
    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        return self._modules[str(as_index(i, "ModuleList: index") if isinstance(i, Tensor) else i)]

    def __len__(self):
        return len(self._modules)


def _param(array, backend) -> Parameter:
    return Parameter(tensor(array, backend=backend))


class Linear(Module):
    """x @ W + b with W of shape (in, out) (torch's nn.Linear stores its transpose, (out, in))."""

    def __init__(self, in_size: int, out_size: int, bias: bool = True, backend="reference", rng=None):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        bound = 1.0 / math.sqrt(in_size)  # torch's default init range
        self.weights = _param(rng.uniform(-bound, bound, (in_size, out_size)), backend)
        self.bias = _param(rng.uniform(-bound, bound, (out_size,)), backend) if bias else None
        self.out_size = out_size

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        lead = x.shape[:-1]
        y = x.view(-1, x.shape[-1]) @ self.weights.value  # (N, in) @ (in, out) -> (N, out)
        if self.bias is not None:
            y = y + self.bias.value
        return y.view(*lead, self.out_size)


class Embedding(Module):
    """Row lookup as one_hot(ids) @ W: (..., ) int ids -> (..., dim); its gradient is a matmul too."""

    def __init__(self, num_embeddings: int, embedding_dim: int, backend="reference", rng=None):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.weights = _param(rng.standard_normal((num_embeddings, embedding_dim)), backend)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim

    def forward(self, ids) -> Tensor:
        ids = as_ids(ids, "Embedding: ids")
        onehot = nn.one_hot(ids.reshape(-1), self.num_embeddings, self.weights.value.backend)  # (N, V)
        return (onehot @ self.weights.value).view(*ids.shape, self.embedding_dim)  # (N, V) @ (V, d)


class LayerNorm1d(Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension (biased variance, as torch)."""

    def __init__(self, dim: int, eps: float = 1e-5, backend="reference"):
        super().__init__()
        self.eps = eps
        self.weights = _param(np.ones(dim), backend)
        self.bias = _param(np.zeros(dim), backend)

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        centred = x - mean
        var = (centred * centred).mean(-1, keepdim=True)
        return centred / (var + self.eps) ** 0.5 * self.weights.value + self.bias.value


class Dropout(Module):
    def __init__(self, p: float = 0.1):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return nn.dropout(x, self.p, self.training)
