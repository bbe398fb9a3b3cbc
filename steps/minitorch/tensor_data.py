"""Strided storage: a flat float64 buffer, a shape and strides (miniTorch's `tensor_data.py`).

A tensor's element at index (i0, i1, ...) lives at storage[sum(i_k * strides_k)]. Views (permute,
view of a contiguous tensor, broadcasting) change shape and strides, never the storage.

The index helpers below are written with arithmetic only, so the same source serves three callers:
scalars one element at a time (`fast` compiles them with `numba.njit`, `cuda` as device functions)
and NumPy arrays of many indices at once (the `reference` kernels pass one row per dimension).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

MAX_DIMS = 32


class IndexingError(ValueError):
    """A shape, index or view that does not fit the tensor: the message says which and why."""


def index_to_position(index, strides):
    """Storage position of `index` (one entry per dimension): sum_k index[k] * strides[k]."""
    position = 0
    for k in range(len(strides)):
        position += index[k] * strides[k]
    return position


def to_index(ordinal, shape, out_index):
    """Fill `out_index` with the multi-index of the `ordinal`-th element in row-major order."""
    rest = ordinal
    for k in range(len(shape) - 1, -1, -1):
        out_index[k] = rest % shape[k]
        rest = rest // shape[k]


def broadcast_index(big_index, big_shape, shape, out_index):
    """Map an index of the broadcast (big) shape to the smaller `shape`: leading dimensions the small
    shape lacks are dropped, its size-1 dimensions read index 0."""
    offset = len(big_shape) - len(shape)
    for k in range(len(shape)):
        out_index[k] = big_index[k + offset] * (shape[k] > 1)


def shape_broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """NumPy's rule: align on the right; sizes equal, or one of them 1."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise IndexingError(f"shapes {a} and {b} do not broadcast: {x} vs {y}")
        out.append(max(x, y))
    return tuple(out)


def strides_from_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major (contiguous) strides, in elements."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class TensorData:
    """storage (1-D float64), shape, strides: what every kernel receives as a triple."""

    def __init__(self, storage: np.ndarray, shape: Sequence[int], strides: Sequence[int] | None = None):
        storage = np.asarray(storage, dtype=np.float64)
        if storage.ndim != 1 or not storage.flags.c_contiguous:
            storage = np.ascontiguousarray(storage).reshape(-1)
        self.storage = storage  # views keep the very same buffer
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides) if strides is not None else strides_from_shape(self.shape)
        if len(self.strides) != len(self.shape):
            raise IndexingError(f"strides {self.strides} do not match shape {self.shape}")
        if len(self.shape) > MAX_DIMS:
            raise IndexingError(f"{len(self.shape)} dimensions: at most {MAX_DIMS}")
        self.size = int(np.prod(self.shape, dtype=np.int64))
        if self.size and index_to_position([s - 1 for s in self.shape], self.strides) >= len(self.storage):
            raise IndexingError(
                f"shape {self.shape} with strides {self.strides} overruns a storage of {len(self.storage)} elements"
            )
        # the same as int64 arrays: what the compiled kernels index with
        self.shape_array = np.array(self.shape, dtype=np.int64)
        self.strides_array = np.array(self.strides, dtype=np.int64)

    @classmethod
    def from_numpy(cls, array) -> TensorData:
        array = np.asarray(array, dtype=np.float64)
        return cls(array.copy().reshape(-1), array.shape)

    @property
    def dims(self) -> int:
        return len(self.shape)

    def tuple(self):
        """(storage, shape, strides): the three arguments a kernel takes per tensor."""
        return self.storage, self.shape_array, self.strides_array

    def is_contiguous(self) -> bool:
        """Row-major with no gaps: every dimension of size > 1 has its row-major stride."""
        row_major = strides_from_shape(self.shape)
        return all(st == rm for st, rm, size in zip(self.strides, row_major, self.shape) if size > 1)

    def position(self, index: Sequence[int]) -> int:
        if len(index) != self.dims:
            raise IndexingError(f"index {tuple(index)} has {len(index)} dimensions; the tensor has {self.dims}")
        for i, size in zip(index, self.shape):
            if not 0 <= i < size:
                raise IndexingError(f"index {tuple(index)} out of range for shape {self.shape}")
        return index_to_position(index, self.strides)

    def get(self, index: Sequence[int]) -> float:
        return float(self.storage[self.position(index)])

    def set(self, index: Sequence[int], value: float) -> None:
        self.storage[self.position(index)] = value

    def permute(self, *order: int) -> TensorData:
        """The same storage with dimensions reordered: dimension k of the result is `order[k]`."""
        if sorted(order) != list(range(self.dims)):
            raise IndexingError(f"permute{tuple(order)} is not an ordering of {self.dims} dimensions")
        return TensorData(self.storage, [self.shape[k] for k in order], [self.strides[k] for k in order])

    def view(self, *shape: int) -> TensorData:
        """The same storage read with a new shape: only a contiguous tensor can be viewed so."""
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise IndexingError(f"view{tuple(shape)} has {int(np.prod(shape))} elements; the tensor has {self.size}")
        if not self.is_contiguous():
            raise IndexingError(
                f"view of a non-contiguous tensor (shape {self.shape}, strides {self.strides}): "
                "call .contiguous() first"
            )
        return TensorData(self.storage, shape)

    def to_numpy(self) -> np.ndarray:
        """A NumPy copy in row-major order (strides in bytes for NumPy)."""
        view = np.lib.stride_tricks.as_strided(self.storage, self.shape, [s * 8 for s in self.strides])
        return np.array(view, dtype=np.float64)
