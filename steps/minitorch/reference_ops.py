"""The four kernel primitives, defined: the `reference` backend (miniTorch's `tensor_ops.py` kernels).

Every tensor op is one of

    map(fn)     out[i] = fn(a[i'])                    i' = i broadcast into a's shape
    zip(fn)     out[i] = fn(a[i'], b[i''])            both broadcast into out's shape
    reduce(fn)  out[i] = fn(...fn(fn(start, a[i|0]), a[i|1])..., a[i|n-1])    along one dimension
    matmul      out[b, i, j] = sum_k a[b', i, k] * b[b'', k, j]              3-D, batch broadcast

and each backend (`fast_ops.py`, `cuda_ops.py`) implements the same four with the same signatures:
`map(fn)`, `zip(fn)` and `reduce(fn)` return a kernel; a kernel writes into `out` and takes every
tensor as its (storage, shape, strides) triple (`TensorData.tuple()`):

    map kernel     (out, out_shape, out_strides, a, a_shape, a_strides)
    zip kernel     (out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides)
    reduce kernel  (out, out_shape, out_strides, a, a_shape, a_strides, dim, start)   out_shape[dim] == 1
    matmul         (out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides)

Here the index arithmetic runs on NumPy arrays holding every element's index at once (one row per
dimension, the helpers of `tensor_data.py` unchanged), and `fn` - a plain scalar function of
`scalar_ops.py` - is applied element by element in Python: readable, exact, and slow.
"""

import numpy as np

from .tensor_data import broadcast_index, index_to_position, to_index


def _all_indices(shape, n):
    """Every multi-index of `shape` in row-major order: shape (dims, n)."""
    index = np.zeros((len(shape), n), dtype=np.int64)
    to_index(np.arange(n, dtype=np.int64), shape, index)
    return index


def _positions(index, strides, n):
    return np.zeros(n, dtype=np.int64) + index_to_position(index, strides)


def _broadcast_positions(out_index, out_shape, shape, strides, n):
    index = np.zeros((len(shape), n), dtype=np.int64)
    broadcast_index(out_index, out_shape, shape, index)
    return _positions(index, strides, n)


def _apply(fn, *values):
    """fn(x, ...) on each element, in Python."""
    return np.frompyfunc(fn, len(values), 1)(*values).astype(np.float64)


def tensor_map(fn):
    def _map(out, out_shape, out_strides, a, a_shape, a_strides):
        n = int(np.prod(out_shape))
        out_index = _all_indices(out_shape, n)
        a_pos = _broadcast_positions(out_index, out_shape, a_shape, a_strides, n)
        out[_positions(out_index, out_strides, n)] = _apply(fn, a[a_pos])

    return _map


def tensor_zip(fn):
    def _zip(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
        n = int(np.prod(out_shape))
        out_index = _all_indices(out_shape, n)
        a_pos = _broadcast_positions(out_index, out_shape, a_shape, a_strides, n)
        b_pos = _broadcast_positions(out_index, out_shape, b_shape, b_strides, n)
        out[_positions(out_index, out_strides, n)] = _apply(fn, a[a_pos], b[b_pos])

    return _zip


def tensor_reduce(fn):
    def _reduce(out, out_shape, out_strides, a, a_shape, a_strides, dim, start):
        n = int(np.prod(out_shape))
        out_index = _all_indices(out_shape, n)  # index `dim` is 0: the first element of each row
        a_pos = _positions(out_index, a_strides, n)
        rows = a[a_pos[:, None] + np.arange(a_shape[dim]) * a_strides[dim]]  # (n, size of dim): each row in order
        folded = np.frompyfunc(fn, 2, 1).reduce(rows.astype(object), axis=1, initial=start)  # fn(fn(start, r0), r1)...
        out[_positions(out_index, out_strides, n)] = folded.astype(np.float64)

    return _reduce


def tensor_matmul(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    n = int(np.prod(out_shape))
    batch, i, j = _all_indices(out_shape, n)
    # a batch of size 1 is shared by every output batch (broadcast); a row i of a, a column j of b
    a_pos = batch * (a_shape[0] > 1) * a_strides[0] + i * a_strides[1]
    b_pos = batch * (b_shape[0] > 1) * b_strides[0] + j * b_strides[2]
    acc = np.zeros(n, dtype=np.float64)
    for k in range(a_shape[2]):
        acc += a[a_pos + k * a_strides[2]] * b[b_pos + k * b_strides[1]]
    out[_positions(np.stack([batch, i, j]), out_strides, n)] = acc


map = tensor_map
zip = tensor_zip
reduce = tensor_reduce
matmul = tensor_matmul
