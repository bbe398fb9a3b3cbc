"""The `cuda` backend: the four kernel primitives as CUDA kernels through `numba.cuda` (miniTorch's CudaOps).

Same interface as `reference_ops.py` (read its docstring). Kernels:

- map / zip: one thread per output element; each thread turns its ordinal into an index, broadcasts it
  into the inputs' shapes and reads/writes through the strides (the `tensor_data.py` helpers, compiled
  as device functions, with per-thread index buffers in local memory).
- reduce: one block per output element; its THREADS threads stride over the reduced dimension, each
  folding its own elements, then combine their partial results in shared memory as a tree (halving the
  active threads each step). The tree reorders the fold, so `fn` must be associative (add, max, mul):
  a sum differs from the reference's left-to-right order by rounding only.
- matmul: TILE x TILE output tiles, one block each, the batch on grid z; the block walks the depth in
  TILE steps, loading a TILE x TILE tile of a and of b into shared memory (each thread one element of
  each), then every thread accumulates its dot product from the tiles.

The host wrappers are the simple form: copy every storage (and shape, strides) to the device, launch,
copy `out` back. Under Numba's CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`, set before numba is imported)
the same kernels run as Python threads on the CPU: the tests use it, with smaller blocks (every
simulated thread is a Python thread) - the kernels' code is the same, only the block sizes shrink.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from . import tensor_data
from .tensor_data import MAX_DIMS

SIMULATED = bool(numba.config.ENABLE_CUDASIM)
THREADS = 4 if SIMULATED else 256  # threads per block: map / zip, and reduce's threads per output element
TILE = 4 if SIMULATED else 32  # matmul tile (TILE x TILE threads per block)

# the index helpers of tensor_data.py as device functions
to_index = cuda.jit(device=True)(tensor_data.to_index)
index_to_position = cuda.jit(device=True)(tensor_data.index_to_position)
broadcast_index = cuda.jit(device=True)(tensor_data.broadcast_index)

_KERNELS: dict = {}  # (primitive, fn) -> compiled kernel


def _kernel(primitive, fn, make):
    """The CUDA kernel `make(device fn)` for this (primitive, fn), built once per process."""
    key = (primitive, fn)
    if key not in _KERNELS:
        _KERNELS[key] = cuda.jit(make(cuda.jit(device=True)(fn)))
    return _KERNELS[key]


def _to_device(*arrays):
    """Every array copied to the device; scalars pass as they are."""
    return [cuda.to_device(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x for x in arrays]


def _launch(kernel, grid, block, out, *arrays):
    """Copy `out` and every other array to the device, run `kernel[grid, block]`, copy `out` back."""
    device_out, *device_arrays = _to_device(out, *arrays)
    kernel[grid, block](device_out, *device_arrays)
    device_out.copy_to_host(out)


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


# ---- kernels ----


def _map_kernel(fn):
    def _map(out, out_shape, out_strides, size, a, a_shape, a_strides):
        out_index = cuda.local.array(MAX_DIMS, numba.int64)
        a_index = cuda.local.array(MAX_DIMS, numba.int64)
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < size:
            to_index(i, out_shape, out_index)
            broadcast_index(out_index, out_shape, a_shape, a_index)
            out[index_to_position(out_index, out_strides)] = fn(a[index_to_position(a_index, a_strides)])

    return _map


def _zip_kernel(fn):
    def _zip(out, out_shape, out_strides, size, a, a_shape, a_strides, b, b_shape, b_strides):
        out_index = cuda.local.array(MAX_DIMS, numba.int64)
        a_index = cuda.local.array(MAX_DIMS, numba.int64)
        b_index = cuda.local.array(MAX_DIMS, numba.int64)
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < size:
            to_index(i, out_shape, out_index)
            broadcast_index(out_index, out_shape, a_shape, a_index)
            broadcast_index(out_index, out_shape, b_shape, b_index)
            x = a[index_to_position(a_index, a_strides)]
            y = b[index_to_position(b_index, b_strides)]
            out[index_to_position(out_index, out_strides)] = fn(x, y)

    return _zip


def _reduce_kernel(fn):
    def _reduce(out, out_shape, out_strides, a, a_shape, a_strides, dim, start):
        partial = cuda.shared.array(THREADS, numba.float64)  # one partial result per thread
        index = cuda.local.array(MAX_DIMS, numba.int64)
        t = cuda.threadIdx.x
        to_index(cuda.blockIdx.x, out_shape, index)  # this block's output element; index[dim] == 0
        p = index_to_position(index, a_strides)
        n = a_shape[dim]
        if t < n:  # thread t folds elements t, t + THREADS, ... of the reduced dimension
            acc = a[p + t * a_strides[dim]]
            for j in range(t + THREADS, n, THREADS):
                acc = fn(acc, a[p + j * a_strides[dim]])
            partial[t] = acc
        cuda.syncthreads()
        valid, step = min(n, THREADS), THREADS // 2  # partial[0 .. valid) hold results
        while step > 0:
            if t < step and t + step < valid:
                partial[t] = fn(partial[t], partial[t + step])
            cuda.syncthreads()
            valid, step = min(valid, step), step // 2
        if t == 0:
            out[index_to_position(index, out_strides)] = fn(start, partial[0]) if n > 0 else start

    return _reduce


@cuda.jit
def _matmul(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    a_tile = cuda.shared.array((TILE, TILE), numba.float64)  # a[batch, i0 + r, k0 + c]
    b_tile = cuda.shared.array((TILE, TILE), numba.float64)  # b[batch, k0 + r, j0 + c]
    batch = cuda.blockIdx.z
    r, c = cuda.threadIdx.y, cuda.threadIdx.x  # c along the contiguous dimension: coalesced reads of b, out
    i, j = cuda.blockIdx.y * TILE + r, cuda.blockIdx.x * TILE + c
    rows, cols, depth = out_shape[1], out_shape[2], a_shape[2]
    a_base = batch * (a_shape[0] > 1) * a_strides[0]  # a batch of 1 is shared by every output batch
    b_base = batch * (b_shape[0] > 1) * b_strides[0]
    acc = 0.0
    for k0 in range(0, depth, TILE):
        a_tile[r, c] = a[a_base + i * a_strides[1] + (k0 + c) * a_strides[2]] if i < rows and k0 + c < depth else 0.0
        b_tile[r, c] = b[b_base + (k0 + r) * b_strides[1] + j * b_strides[2]] if k0 + r < depth and j < cols else 0.0
        cuda.syncthreads()
        for k in range(TILE):
            acc += a_tile[r, k] * b_tile[k, c]
        cuda.syncthreads()
    if i < rows and j < cols:
        out[batch * out_strides[0] + i * out_strides[1] + j * out_strides[2]] = acc


# ---- host wrappers: the backend's interface ----


def tensor_map(fn):
    kernel = _kernel("map", fn, _map_kernel)

    def _map(out, out_shape, out_strides, a, a_shape, a_strides):
        size = _size(out_shape)
        if size:
            grid = (size + THREADS - 1) // THREADS
            out_triple = (out_shape, out_strides, np.int64(size))
            _launch(kernel, grid, THREADS, out, *out_triple, a, a_shape, a_strides)

    return _map


def tensor_zip(fn):
    kernel = _kernel("zip", fn, _zip_kernel)

    def _zip(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
        size = _size(out_shape)
        if size:
            grid = (size + THREADS - 1) // THREADS
            out_triple = (out_shape, out_strides, np.int64(size))
            _launch(kernel, grid, THREADS, out, *out_triple, a, a_shape, a_strides, b, b_shape, b_strides)

    return _zip


def tensor_reduce(fn):
    kernel = _kernel("reduce", fn, _reduce_kernel)

    def _reduce(out, out_shape, out_strides, a, a_shape, a_strides, dim, start):
        size = _size(out_shape)
        if size:
            args = (a, a_shape, a_strides, np.int64(dim), np.float64(start))
            _launch(kernel, size, THREADS, out, out_shape, out_strides, *args)

    return _reduce


def tensor_matmul(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    batches, rows, cols = (int(s) for s in out_shape)
    if batches * rows * cols:
        grid = ((cols + TILE - 1) // TILE, (rows + TILE - 1) // TILE, batches)
        _launch(_matmul, grid, (TILE, TILE), out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides)


map = tensor_map
zip = tensor_zip
reduce = tensor_reduce
matmul = tensor_matmul
