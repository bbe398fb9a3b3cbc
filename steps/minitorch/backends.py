"""Which kernel backends this machine runs, each backend's module, and its matmul speed.

    name        module             kernels                                  runs where
    reference   reference_ops.py   NumPy index arithmetic, fn in Python     always (the definition)
    fast        fast_ops.py        Numba njit(parallel=True) on the CPU     numba imports
    cuda        cuda_ops.py        numba.cuda kernels                       a GPU, or NUMBA_ENABLE_CUDASIM=1

Every module has the same four names (`map`, `zip`, `reduce`, `matmul`; see `reference_ops.py`).
"""

from __future__ import annotations

import importlib
import time

import numpy as np

MODULES = {"reference": "reference_ops", "fast": "fast_ops", "cuda": "cuda_ops"}


def _numba_imports() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _cuda_runs() -> bool:
    if not _numba_imports():
        return False
    import numba
    from numba import cuda

    return bool(numba.config.ENABLE_CUDASIM) or cuda.is_available()


def available() -> tuple[str, ...]:
    """The backends this machine can run, in MODULES' order."""
    names = ["reference"]
    if _numba_imports():
        names.append("fast")
    if _cuda_runs():
        names.append("cuda")
    return tuple(names)


def why_unavailable(name: str) -> str:
    """What backend `name` needs that this machine lacks ('' when it runs here)."""
    if name not in MODULES:
        return f"unknown miniTorch backend {name!r}: choose one of {', '.join(MODULES)}"
    if name in available():
        return ""
    if name == "fast" or not _numba_imports():
        return "numba does not import: pip install numba (pyproject.toml lists it)"
    return "no CUDA GPU: numba.cuda.is_available() is False (to simulate one: NUMBA_ENABLE_CUDASIM=1 before numba)"


def kernels(name: str):
    """The module of backend `name` (it has `map`, `zip`, `reduce`, `matmul`)."""
    why = why_unavailable(name)
    if why:
        raise ValueError(why if name not in MODULES else f"miniTorch backend {name!r} cannot run here: {why}")
    return importlib.import_module(f"{__package__}.{MODULES[name]}")


def matmul_gflops(name: str, n: int = 512, repeats: int = 5) -> float:
    """The backend's matmul on (1, n, n) @ (1, n, n) in float64: 2 n^3 flops over the best of
    `repeats` timed calls (after one untimed call that compiles), in GFLOP/s."""
    from .tensor_data import TensorData

    rng = np.random.default_rng(0)
    a, b = (TensorData.from_numpy(rng.standard_normal((1, n, n))) for _ in range(2))
    out = TensorData(np.zeros(n * n), (1, n, n))
    matmul = kernels(name).matmul
    best = float("inf")
    for r in range(repeats + 1):
        start = time.perf_counter()
        matmul(*out.tuple(), *a.tuple(), *b.tuple())
        if r:  # r == 0 compiles (fast, cuda) and warms caches
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9
