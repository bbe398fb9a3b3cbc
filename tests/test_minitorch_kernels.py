"""Every backend's four kernels equal the reference backend's (`reference_ops.py`, the definition).

Property-based (hypothesis): random shapes, inputs broadcast into the output's shape, inputs and
outputs stored permuted (non-contiguous strides), reduce over every dimension, batched matmul with a
batch of 1 broadcast and transposed operands. Tolerance 1e-12 (float64): compiled `exp`, `tanh` may
differ from Python's by an ulp, and the cuda reduce adds in a tree rather than left to right.

The `cuda` backend runs under Numba's CUDA simulator in a subprocess (NUMBA_ENABLE_CUDASIM must be
set before numba is imported), on small shapes: every simulated thread is a Python thread.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steps.minitorch import backends, reference_ops, scalar_ops
from steps.minitorch.tensor_data import TensorData

BACKENDS = [name for name in backends.available() if name != "reference"]
# fast is tested twice: its parallel builds (PARALLEL_MIN* = 0: every call parallel) and its serial ones
VARIANTS = [v for name in BACKENDS for v in ([name, f"{name}-serial"] if name == "fast" else [name])]
EXAMPLES = {"fast": 40, "cuda": 10}  # hypothesis examples per test: the simulator is slow
MAX_SIZE = {"fast": 6, "cuda": 4}  # largest dimension drawn
TOLERANCE = 1e-12

# a few functions of each arity (each is a kernel to compile, ~1-2 s of CPU): the kernels' index paths are
# what is tested here; every op's function is tested through the engine's parity tests
MAPS = [scalar_ops.neg, scalar_ops.exp, scalar_ops.sigmoid]
ZIPS = [scalar_ops.add, scalar_ops.div, scalar_ops.lt]
REDUCES = [(scalar_ops.add, 0.0), (scalar_ops.max_, -np.inf), (scalar_ops.add, 2.5)]


def base(variant: str) -> str:
    return variant.removesuffix("-serial")


def kernels_for(variant: str, monkeypatch):
    """The kernel module of a variant (fast's builds chosen through its PARALLEL_MIN thresholds)."""
    name = base(variant)
    module = backends.kernels(name)
    if name == "fast":
        for threshold in ("PARALLEL_MIN", "PARALLEL_MIN_MACS"):
            monkeypatch.setattr(module, threshold, sys.maxsize if variant.endswith("-serial") else 0)
    return module


def stored(array: np.ndarray, order) -> TensorData:
    """`array` held in a storage laid out in dimension order `order` (row-major when order is sorted):
    the same values, other strides."""
    inverse = np.argsort(order)
    return TensorData.from_numpy(array.transpose(order)).permute(*inverse)


def empty(shape, order) -> TensorData:
    return stored(np.full(shape, np.nan), order)


@st.composite
def layouts(draw, shape):
    """A storage order for a tensor of `shape`: a permutation of its dimensions."""
    return draw(st.permutations(range(len(shape))))


@st.composite
def broadcast_cases(draw, inputs: int, max_size: int):
    """(out shape, out order, [(input array, input order)], seed): each input's shape is out's with
    leading dimensions dropped and others set to 1."""
    shape = tuple(draw(st.lists(st.integers(1, max_size), min_size=1, max_size=4)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ins = []
    for _ in range(inputs):
        drop = draw(st.integers(0, len(shape) - 1))
        small = tuple(s if draw(st.booleans()) else 1 for s in shape[drop:])
        ins.append((rng.standard_normal(small), draw(layouts(small))))
    return shape, draw(layouts(shape)), ins


def run_elementwise(module, kernel_of, fn, shape, order, ins):
    out = empty(shape, order)
    kernel_of(module)(fn)(*out.tuple(), *(x for array, o in ins for x in stored(array, o).tuple()))
    return out.to_numpy()


def assert_close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE, err_msg=what)


@pytest.mark.parametrize("backend", VARIANTS)
def test_map_and_zip_equal_reference(backend, monkeypatch):
    module = kernels_for(backend, monkeypatch)

    @settings(max_examples=EXAMPLES[base(backend)], deadline=None, derandomize=True, database=None)
    @given(
        case=broadcast_cases(2, MAX_SIZE[base(backend)]),
        map_fn=st.sampled_from(MAPS),
        zip_fn=st.sampled_from(ZIPS),
    )
    def check(case, map_fn, zip_fn):
        shape, order, ins = case
        for kernel_of, fn, args in ((lambda m: m.map, map_fn, ins[:1]), (lambda m: m.zip, zip_fn, ins)):
            want = run_elementwise(reference_ops, kernel_of, fn, shape, order, args)
            got = run_elementwise(module, kernel_of, fn, shape, order, args)
            assert_close(got, want, f"{backend} {fn.__name__} out {shape} inputs {[a.shape for a, _ in args]}")

    check()


def run_reduce(module, fn, start, array, order, dim):
    shape = array.shape[:dim] + (1,) + array.shape[dim + 1 :]
    out = empty(shape, order)
    module.reduce(fn)(*out.tuple(), *stored(array, order).tuple(), dim, start)
    return out.to_numpy()


@pytest.mark.parametrize("backend", VARIANTS)
def test_reduce_over_every_dim_equals_reference(backend, monkeypatch):
    module = kernels_for(backend, monkeypatch)

    @settings(max_examples=EXAMPLES[base(backend)], deadline=None, derandomize=True, database=None)
    @given(case=broadcast_cases(1, MAX_SIZE[base(backend)] + 3), reduce=st.sampled_from(REDUCES))
    def check(case, reduce):
        shape, order, _ = case
        array = np.random.default_rng(len(shape)).standard_normal(shape)
        fn, start = reduce
        for dim in range(len(shape)):
            want = run_reduce(reference_ops, fn, start, array, order, dim)
            got = run_reduce(module, fn, start, array, order, dim)
            assert_close(got, want, f"{backend} reduce {fn.__name__} start {start} over dim {dim} of {shape}")

    check()


def run_matmul(module, a, a_order, b, b_order, out_order):
    shape = (max(a.shape[0], b.shape[0]), a.shape[1], b.shape[2])
    out = empty(shape, out_order)
    module.matmul(*out.tuple(), *stored(a, a_order).tuple(), *stored(b, b_order).tuple())
    return out.to_numpy()


@st.composite
def matmul_cases(draw, max_size):
    batch, rows, depth, cols = (draw(st.integers(1, n)) for n in (3, max_size, max_size, max_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = rng.standard_normal((draw(st.sampled_from([1, batch])), rows, depth))
    b = rng.standard_normal((draw(st.sampled_from([1, batch])), depth, cols))
    orders = st.sampled_from([(0, 1, 2), (0, 2, 1), (2, 1, 0)])  # row-major, transposed, batch innermost
    return a, draw(orders), b, draw(orders), draw(orders)


@pytest.mark.parametrize("backend", VARIANTS)
def test_batched_matmul_equals_reference(backend, monkeypatch):
    module = kernels_for(backend, monkeypatch)

    @settings(max_examples=EXAMPLES[base(backend)], deadline=None, derandomize=True, database=None)
    @given(case=matmul_cases(2 * MAX_SIZE[base(backend)] + 1))
    def check(case):
        want = run_matmul(reference_ops, *case)
        assert_close(run_matmul(module, *case), want, f"{backend} matmul {case[0].shape} @ {case[2].shape}")
        np.testing.assert_allclose(want, np.matmul(case[0], case[2]), rtol=1e-12, atol=1e-12)

    check()


@pytest.mark.parametrize("backend", VARIANTS)
def test_reduce_longer_than_a_block(backend, monkeypatch):
    """A reduced dimension longer than cuda_ops' THREADS (4 under the simulator) and not a multiple of
    it: every thread folds several elements before the tree."""
    array = np.random.default_rng(2).standard_normal((3, 2 * MAX_SIZE[base(backend)] + 3))
    for fn, start in REDUCES:
        want = run_reduce(reference_ops, fn, start, array, (1, 0), 1)
        assert_close(run_reduce(kernels_for(backend, monkeypatch), fn, start, array, (1, 0), 1), want, fn.__name__)


@pytest.mark.skipif("fast" not in BACKENDS, reason="numba does not import")
@pytest.mark.parametrize("variant", ["fast", "fast-serial"])
def test_fast_kernels_across_chunks_and_blocks(variant, monkeypatch):
    """Shapes larger than fast_ops' CHUNK and matmul blocks, so chunk and block edges fall mid-row."""
    fast_ops = kernels_for(variant, monkeypatch)

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 41, 53)), rng.standard_normal((41, 1))  # 6519 > CHUNK elements
    for kernel_of, fn, ins in ((lambda m: m.map, scalar_ops.exp, [(x, (2, 0, 1))]),
                               (lambda m: m.zip, scalar_ops.add, [(x, (1, 2, 0)), (y, (1, 0))])):  # fmt: skip
        want = run_elementwise(reference_ops, kernel_of, fn, x.shape, (0, 2, 1), ins)
        assert_close(run_elementwise(fast_ops, kernel_of, fn, x.shape, (0, 2, 1), ins), want, fn.__name__)
    for dim in range(3):
        want = run_reduce(reference_ops, scalar_ops.add, 0.0, x, (2, 1, 0), dim)
        assert_close(run_reduce(fast_ops, scalar_ops.add, 0.0, x, (2, 1, 0), dim), want, f"sum over {dim}")
    a, b = rng.standard_normal((2, 70, 130)), rng.standard_normal((1, 130, 300))  # > BLOCK_I, BLOCK_K, BLOCK_J
    case = (a, (0, 1, 2), b, (0, 2, 1), (0, 1, 2))
    assert_close(run_matmul(fast_ops, *case), run_matmul(reference_ops, *case), "blocked matmul")


@pytest.mark.skipif("cuda" in BACKENDS or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="cuda runs here")
@pytest.mark.skipif("fast" not in BACKENDS, reason="numba does not import")
def test_gpu_kernels_under_simulator():
    """The cuda backend's tests above, in a process where NUMBA_ENABLE_CUDASIM=1 precedes numba."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    command = [sys.executable, "-m", "pytest", __file__, "-k", "cuda", "-p", "no:cacheprovider", "-o", "addopts="]
    done = subprocess.run(command, cwd=Path(__file__).parents[1], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout, done.stdout[-2000:]  # the four tests parametrized by backend


def test_backends_names_and_errors():
    assert backends.available()[0] == "reference"
    assert backends.kernels("reference") is reference_ops
    with pytest.raises(ValueError, match="unknown miniTorch backend 'tpu'"):
        backends.kernels("tpu")
    if "fast" in BACKENDS:
        assert backends.matmul_gflops("fast", n=64, repeats=1) > 0
