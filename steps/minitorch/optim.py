"""Optimizers: update each parameter's storage from its `.grad` (no autograd involved)."""

from __future__ import annotations

import numpy as np

from .module import Parameter


class Optimizer:
    def __init__(self, parameters):
        self.parameters: list[Parameter] = list(parameters)

    def zero_grad(self) -> None:
        for p in self.parameters:
            p.value.zero_grad_()

    def _pairs(self):
        """(parameter's storage as its shape, its gradient) for every parameter that has one."""
        for i, p in enumerate(self.parameters):
            if p.value.grad is not None:
                data = p.value.data
                if not data.is_contiguous():
                    raise ValueError(f"parameter {i} (shape {data.shape}) is not contiguous")
                yield i, data.storage[: data.size].reshape(data.shape), p.value.grad.to_numpy()


class SGD(Optimizer):
    """p -= lr * v with v = momentum * v + g (torch's SGD; momentum 0 = plain gradient descent)."""

    def __init__(self, parameters, lr: float = 1e-2, momentum: float = 0.0):
        super().__init__(parameters)
        self.lr, self.momentum = lr, momentum
        self.velocity: dict[int, np.ndarray] = {}

    def step(self) -> None:
        for i, w, g in self._pairs():
            if self.momentum:
                v = self.velocity.get(i)
                self.velocity[i] = v = g.copy() if v is None else self.momentum * v + g
                g = v
            w -= self.lr * g  # in place: every view of the storage sees it


class Adam(Optimizer):
    """Adam with bias correction, as torch.optim.Adam computes it; `decoupled` weight decay = AdamW."""

    def __init__(self, parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
        super().__init__(parameters)
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.weight_decay, self.decoupled = weight_decay, decoupled
        self.m: dict[int, np.ndarray] = {}
        self.v: dict[int, np.ndarray] = {}
        self.t = 0

    def step(self) -> None:
        self.t += 1
        bias1, bias2 = 1 - self.beta1**self.t, 1 - self.beta2**self.t
        for i, w, g in self._pairs():
            if self.weight_decay and self.decoupled:
                w *= 1 - self.lr * self.weight_decay
            elif self.weight_decay:
                g = g + self.weight_decay * w
            m = self.m[i] = self.beta1 * self.m.get(i, 0.0) + (1 - self.beta1) * g
            v = self.v[i] = self.beta2 * self.v.get(i, 0.0) + (1 - self.beta2) * g * g
            w -= (self.lr / bias1) * m / (np.sqrt(v) / np.sqrt(bias2) + self.eps)


class AdamW(Adam):
    def __init__(self, parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(parameters, lr, betas, eps, weight_decay, decoupled=True)
