"""A backend = one kernel module's four primitives + allocation and broadcasting (miniTorch's
`TensorBackend`). Ops (tensor_functions.py) call only `map`, `zip`, `reduce` and `matmul` here; which
kernels run them (reference / fast / cuda) is the backend's name.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from . import scalar_ops as S
from .tensor_data import IndexingError, TensorData, shape_broadcast


def zeros(shape) -> TensorData:
    return TensorData(np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=np.float64), shape)


class TensorBackend:
    def __init__(self, name: str, kernels):
        self.name = name
        self.kernels = kernels  # a module with map(fn), zip(fn), reduce(fn), matmul
        self._compiled: dict = {}

    def _kernel(self, primitive: str, fn):
        key = (primitive, fn)
        if key not in self._compiled:  # each (primitive, fn) built (compiled, for fast/cuda) once
            self._compiled[key] = getattr(self.kernels, primitive)(fn)
        return self._compiled[key]

    def map(self, fn, a: TensorData, out_shape=None) -> TensorData:
        """fn on each element; `out_shape` (a shape `a` broadcasts to) expands `a`."""
        out = zeros(a.shape if out_shape is None else out_shape)
        if out_shape is not None:
            shape_broadcast(a.shape, out.shape)  # raises if `a` does not broadcast to it
        self._kernel("map", fn)(*out.tuple(), *a.tuple())
        return out

    def zip(self, fn, a: TensorData, b: TensorData) -> TensorData:
        out = zeros(shape_broadcast(a.shape, b.shape))
        self._kernel("zip", fn)(*out.tuple(), *a.tuple(), *b.tuple())
        return out

    def reduce(self, fn, start: float, a: TensorData, dim: int) -> TensorData:
        """fn folded along `dim` (kept as size 1)."""
        if not 0 <= dim < a.dims:
            raise IndexingError(f"reduce over dimension {dim} of a {a.dims}-dimensional tensor")
        out = zeros(a.shape[:dim] + (1,) + a.shape[dim + 1 :])
        self._kernel("reduce", fn)(*out.tuple(), *a.tuple(), dim, float(start))
        return out

    def matmul(self, a: TensorData, b: TensorData) -> TensorData:
        """(..., M, K) @ (..., K, N) -> (..., M, N), batch dimensions broadcast; the kernel sees 3-D."""
        if a.dims < 2 or b.dims < 2:
            raise IndexingError(f"matmul needs 2+ dimensions on both sides, got {a.shape} @ {b.shape}")
        (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
        if k != k2:
            raise IndexingError(f"matmul {a.shape} @ {b.shape}: inner sizes {k} and {k2} differ")
        batch = shape_broadcast(a.shape[:-2], b.shape[:-2])
        a3, b3 = self._as_3d(a, batch), self._as_3d(b, batch)
        out = zeros((int(np.prod(batch, dtype=np.int64)), m, n))
        self.kernels.matmul(*out.tuple(), *a3.tuple(), *b3.tuple())
        return out.view(*batch, m, n)

    def _as_3d(self, x: TensorData, batch) -> TensorData:
        """(B, rows, cols) with B = prod(batch), or 1 where x has no batch of its own (the kernel
        broadcasts a batch of 1); a partial broadcast is expanded by copying."""
        rows, cols = x.shape[-2:]
        if int(np.prod(x.shape[:-2], dtype=np.int64)) == 1:
            return self.contiguous(x).view(1, rows, cols)
        if tuple(x.shape[:-2]) != tuple(batch):
            x = self.map(S.id_, x, tuple(batch) + (rows, cols))
        return self.contiguous(x).view(int(np.prod(batch, dtype=np.int64)), rows, cols)

    def contiguous(self, x: TensorData) -> TensorData:
        return x if x.is_contiguous() else self.map(S.id_, x)


@cache
def get_backend(name: str) -> TensorBackend:
    from . import backends  # the kernel modules, and which of them this machine can run

    return TensorBackend(name, backends.kernels(name))
