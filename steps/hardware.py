"""Machine facts every benchmark needs: the measured matmul peak (the MFU denominator) and
process peak memory that can be reset between phases.

MFU is only honest against a peak measured on the same device, dtype and thread count, so the
peak is measured here rather than taken from a spec sheet.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from contextlib import contextmanager
from pathlib import Path


def matmul_peak_flops(dtype: str = "float32", device: str = "cpu", n: int = 2048,
                      repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of an n×n×n matmul (2n³ FLOPs) in `dtype` on `device`."""
    import torch

    dt = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a @ b  # warm-up: thread pool, kernel selection
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def native_matmul(dtype: str, device: str = "cpu", n: int = 256) -> tuple[bool, float, float]:
    """(fast, dtype FLOP/s, float32 FLOP/s) of a small probe matmul: does this device multiply
    `dtype` natively? A CPU without AVX512-BF16/AMX runs bf16 matmuls through a scalar fallback
    ~100x slower than fp32 (measured: 1.3 vs 170 GFLOP/s on an AVX2-only EPYC), which would turn
    a bf16 cell into hours. "Native" = at least half the fp32 rate: the gap is two orders of
    magnitude either way. One thread: a small multi-threaded matmul on a loaded machine waits
    for its descheduled peer thread (measured 2 GFLOP/s fp32 at 256³), one thread does not.
    The probe only decides whether to run; the MFU denominator is `matmul_peak_flops`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        low = matmul_peak_flops(dtype, device, n, repeats=5)
        fp32 = low if dtype == "float32" else matmul_peak_flops("float32", device, n, repeats=5)
    finally:
        torch.set_num_threads(threads)
    return low >= 0.5 * fp32, low, fp32


def slow_matmul_reason(dtype: str, device: str = "cpu") -> str | None:
    """Why `dtype` is not worth timing on this device (None when its matmul is native): the one
    wording the perf cells' and gpt_train bench's skips share."""
    if device != "cpu":
        return None
    fast, low, fp32 = native_matmul(dtype, device)
    return None if fast else (f"no native {dtype} matmul on this CPU "
                              f"(probe {low / 1e9:.1f} vs float32 {fp32 / 1e9:.0f} GFLOP/s)")


def gpt_flops_per_token(n_params_non_embedding: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token, 6N + 12·L·d·T (PaLM appendix B; nanoGPT's estimate_mfu)."""
    return 6 * n_params_non_embedding + 12 * n_layer * d_model * seq_len


def reset_peak_rss() -> bool:
    """Reset the kernel's VmHWM for this process (Linux: write 5 to clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_rss_bytes() -> int:
    """Peak resident set since start or the last `reset_peak_rss()`."""
    return _status_kib("VmHWM") * 1024


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


@contextmanager
def reuse_freed_memory(threshold: int = 32 * 2**20):
    """glibc only: inside, freed blocks up to `threshold` bytes stay in the heap for reuse
    (mmap threshold raised, no trimming); on exit the small threshold the perf stage runs with
    is restored and the retained memory returned to the kernel (malloc_trim).

    Why: the perf stage starts with MALLOC_MMAP_THRESHOLD_=65536 so that RSS follows tensor
    bytes (exact peak memory). But then every tensor above 64 KiB is a fresh mmap, page-faulted
    and zeroed by the kernel on each allocation: measured 15-18 % of a fp32 step. Training code
    never runs like that, so the timed steps run inside this block and memory is measured
    outside it (the restored threshold is the process's MALLOC_MMAP_THRESHOLD_, else glibc's
    initial 128 KiB)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "mallopt"):  # not glibc
        yield
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, threshold)
    libc.mallopt(M_TRIM_THRESHOLD, 2**30)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, int(os.environ.get("MALLOC_MMAP_THRESHOLD_", 128 * 1024)))
        libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)
        libc.malloc_trim(0)
