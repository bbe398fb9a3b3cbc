"""The `fast` backend: the four kernel primitives compiled by Numba for the CPU (miniTorch's FastOps).

Same interface as `reference_ops.py` (read its docstring): `map(fn)`, `zip(fn)`, `reduce(fn)` return a
kernel, `matmul` is one; every tensor arrives as (storage, shape, strides). Here each kernel is one
`numba.njit(parallel=True)` function whose outer loop is a `prange` (split over the cores), also built
serial (prange runs as range) for work under PARALLEL_MIN(_MACS), where waking threads costs more than it saves:

- map / zip: a fast path when out and the inputs have the same shape and the same row-major strides
  (out[i] = fn(a[i]), no index arithmetic); otherwise `prange` over chunks of CHUNK output elements.
  Each chunk allocates its index buffer once, finds its first element's storage positions with the
  `tensor_data.py` helpers, then walks its elements like an odometer: the positions move by strides
  (a broadcast dimension has stride 0), no index buffer and no multiply in the inner loop.
- reduce: `prange` over output elements; the inner loop walks the reduced dimension by adding its stride.
- matmul: the blocked kernel of `fast_matmul.py` (per block of rows, contiguous panels of b), built
  serial and parallel here like the others.

`fn` is a plain scalar function of `scalar_ops.py`; it is compiled with `njit(inline="always")` and
the kernel built around it is kept per fn (each op compiles once per process) and cached on disk by
Numba (`cache=True`: a later process loads the machine code instead of compiling again).
"""

from __future__ import annotations

import hashlib
import inspect
import types

import numpy as np
from numba import njit, prange

from . import tensor_data
from .fast_matmul import blocked_matmul

CHUNK = 2048  # output elements per prange iteration of map / zip / reduce
# Below these sizes a kernel runs its serial build on the calling thread. A parallel launch wakes the worker
# threads and waits for them: ~10-20 us on idle cores, milliseconds on this lab's shared 2-core machine
# (measured there under load ~10: a miniTorch GPT step (default stage shape) took 1.0 s with the parallel
# builds from 65536 elements / multiply-adds up, 0.15 s all serial). So only work of a millisecond or more
# serially goes parallel.
PARALLEL_MIN = 1 << 20  # elements of out (map, zip) or of a (reduce)
PARALLEL_MIN_MACS = 1 << 24  # multiply-adds of a matmul

# the index helpers of tensor_data.py, compiled. Numba's own inlining (inline="always") costs compile time
# (~0.5 s a kernel): only the per-element step (_advance) and fn use it; LLVM inlines the rest or not.
to_index = njit(tensor_data.to_index)
index_to_position = njit(tensor_data.index_to_position)

_KERNELS: dict = {}  # (primitive, fn) -> compiled kernel


def _scalar(fn):
    """fn compiled for use inside a kernel, and whether the kernel around it may be cached on disk.

    Numba keys its disk cache on the kernel's closure (this compiled fn) pickled, and a compiled
    function pickles with a random per-process id: naming it by fn's module, name and source makes
    the key the same in every process. A fn with a closure (or no source) is not cached: two such
    functions can share a name and source and still differ."""
    compiled = njit(inline="always")(fn)
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return compiled, False
    if fn.__closure__ is not None:
        return compiled, False
    # Numba checks this file's timestamp, not those of the functions it calls: the helpers compiled
    # into every kernel (tensor_data.py) join fn's source in the key, so editing them recompiles
    helpers = "".join(inspect.getsource(f) for f in (tensor_data.to_index, tensor_data.index_to_position))
    digest = hashlib.sha256((source + helpers).encode()).hexdigest()[:16]
    try:
        compiled._set_uuid(f"minitorch.fast_ops:{fn.__module__}.{fn.__qualname__}:{digest}")
    except (AttributeError, AssertionError):  # Numba's private API moved: compile per process instead
        return compiled, False
    return compiled, True


def _builds(body, cache):
    """(serial, parallel): `body` compiled twice, with njit and njit(parallel=True) (prange runs as range
    in the serial one). Numba's disk cache names entries by the function's qualified name and signature,
    not by `parallel`: each build compiles a copy of `body` under its own name."""
    builds = []
    for suffix, parallel in (("_serial", False), ("_parallel", True)):
        copy = types.FunctionType(body.__code__, body.__globals__, body.__name__ + suffix, None, body.__closure__)
        copy.__qualname__ = body.__qualname__ + suffix
        builds.append(njit(parallel=parallel, cache=cache)(copy))
    return tuple(builds)


def _kernel(primitive, fn, make):
    """(serial, parallel) builds of the kernel `make(fn)` for this (primitive, fn), made once per process
    (each build compiles on its first call, or loads from Numba's disk cache)."""
    key = (primitive, fn)
    if key not in _KERNELS:
        scalar, cacheable = _scalar(fn)
        _KERNELS[key] = _builds(make(scalar), cacheable)
    return _KERNELS[key]


# ---- index arithmetic shared by the kernels ----


@njit
def _size(shape):
    n = 1
    for s in shape:
        n *= s
    return n


@njit
def _same_layout(out_shape, out_strides, shape, strides):
    """out and the input are the same row-major layout: element i of one is element i of the other.
    (A dimension of size 1 is always read at index 0: its stride does not matter.)"""
    if len(shape) != len(out_shape):
        return False
    step = 1
    for k in range(len(out_shape) - 1, -1, -1):
        if shape[k] != out_shape[k]:
            return False
        if out_shape[k] > 1 and (strides[k] != step or out_strides[k] != step):
            return False
        step *= out_shape[k]
    return True


@njit
def _broadcast_strides(out_shape, shape, strides, table, row):
    """table[row] = the input's strides along out's dimensions; 0 where the input is broadcast (a
    dimension it lacks, or of size 1), so one odometer over out's index moves every position."""
    offset = len(out_shape) - len(shape)
    for k in range(offset):
        table[row, k] = 0
    for k in range(len(shape)):
        table[row, k + offset] = strides[k] * (shape[k] > 1)


@njit(inline="always")
def _start(first, out_shape, table, index, pos):
    """index = the multi-index of output element `first`; pos[t] = its position in tensor t."""
    to_index(first, out_shape, index)
    for t in range(table.shape[0]):
        pos[t] = index_to_position(index, table[t])


@njit(inline="always")
def _advance(index, shape, table, pos):
    """Move index (and every tensor's position) to the next element in row-major order."""
    k = len(shape) - 1
    while k >= 0:
        index[k] += 1
        for t in range(table.shape[0]):
            pos[t] += table[t, k]
        if index[k] < shape[k] or k == 0:
            return
        index[k] = 0  # carry into dimension k - 1
        for t in range(table.shape[0]):
            pos[t] -= shape[k] * table[t, k]
        k -= 1


# ---- the four primitives ----


def _map_kernel(fn):
    def _map(out, out_shape, out_strides, a, a_shape, a_strides):
        size = _size(out_shape)
        if _same_layout(out_shape, out_strides, a_shape, a_strides):
            for i in prange(size):
                out[i] = fn(a[i])
            return
        table = np.empty((2, len(out_shape)), np.int64)  # strides of out, a along out's dimensions
        _broadcast_strides(out_shape, out_shape, out_strides, table, 0)
        _broadcast_strides(out_shape, a_shape, a_strides, table, 1)
        for c in prange((size + CHUNK - 1) // CHUNK):
            index = np.empty(len(out_shape), np.int64)
            pos = np.empty(2, np.int64)
            _start(c * CHUNK, out_shape, table, index, pos)
            for _ in range(c * CHUNK, min(size, (c + 1) * CHUNK)):
                out[pos[0]] = fn(a[pos[1]])
                _advance(index, out_shape, table, pos)

    return _map


def _zip_kernel(fn):
    def _zip(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
        size = _size(out_shape)
        if _same_layout(out_shape, out_strides, a_shape, a_strides) and _same_layout(
            out_shape, out_strides, b_shape, b_strides
        ):
            for i in prange(size):
                out[i] = fn(a[i], b[i])
            return
        table = np.empty((3, len(out_shape)), np.int64)  # strides of out, a, b along out's dimensions
        _broadcast_strides(out_shape, out_shape, out_strides, table, 0)
        _broadcast_strides(out_shape, a_shape, a_strides, table, 1)
        _broadcast_strides(out_shape, b_shape, b_strides, table, 2)
        for c in prange((size + CHUNK - 1) // CHUNK):
            index = np.empty(len(out_shape), np.int64)
            pos = np.empty(3, np.int64)
            _start(c * CHUNK, out_shape, table, index, pos)
            for _ in range(c * CHUNK, min(size, (c + 1) * CHUNK)):
                out[pos[0]] = fn(a[pos[1]], b[pos[2]])
                _advance(index, out_shape, table, pos)

    return _zip


def _reduce_kernel(fn):
    def _reduce(out, out_shape, out_strides, a, a_shape, a_strides, dim, start):
        size = _size(out_shape)
        n, step = a_shape[dim], a_strides[dim]
        table = np.empty((2, len(out_shape)), np.int64)  # out_shape[dim] == 1: a's index is out's
        _broadcast_strides(out_shape, out_shape, out_strides, table, 0)
        _broadcast_strides(out_shape, out_shape, a_strides, table, 1)
        for c in prange((size + CHUNK - 1) // CHUNK):
            index = np.empty(len(out_shape), np.int64)
            pos = np.empty(2, np.int64)
            _start(c * CHUNK, out_shape, table, index, pos)
            for _ in range(c * CHUNK, min(size, (c + 1) * CHUNK)):
                acc, p = start, pos[1]
                for _j in range(n):  # along the reduced dimension: one add per element
                    acc = fn(acc, a[p])
                    p += step
                out[pos[0]] = acc
                _advance(index, out_shape, table, pos)

    return _reduce


def tensor_map(fn):
    serial, parallel = _kernel("map", fn, _map_kernel)

    def _map(out, out_shape, out_strides, a, a_shape, a_strides):
        (parallel if len(out) >= PARALLEL_MIN else serial)(out, out_shape, out_strides, a, a_shape, a_strides)

    return _map


def tensor_zip(fn):
    serial, parallel = _kernel("zip", fn, _zip_kernel)

    def _zip(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
        kernel = parallel if len(out) >= PARALLEL_MIN else serial
        kernel(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides)

    return _zip


def tensor_reduce(fn):
    serial, parallel = _kernel("reduce", fn, _reduce_kernel)

    def _reduce(out, out_shape, out_strides, a, a_shape, a_strides, dim, start):
        kernel = parallel if len(a) >= PARALLEL_MIN else serial
        # one compiled signature: dim an int64, start a float64, whatever Python type the caller passed
        kernel(out, out_shape, out_strides, a, a_shape, a_strides, int(dim), float(start))

    return _reduce


_matmul_serial, _matmul_parallel = _builds(blocked_matmul, cache=True)


def tensor_matmul(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):
    kernel = _matmul_parallel if len(out) * a_shape[2] >= PARALLEL_MIN_MACS else _matmul_serial
    kernel(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides)


map = tensor_map
zip = tensor_zip
reduce = tensor_reduce
matmul = tensor_matmul
