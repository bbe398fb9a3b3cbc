"""Machine facts every benchmark needs: the measured matmul peak (the MFU denominator) and
process peak memory that can be reset between phases.

MFU is quoted against two peaks: the one measured here on the same device, dtype and thread
count (what this machine can really do), and, on GPUs, the device's published dense peak for
the dtype (what the literature quotes: nanoGPT, llm.c, torchtitan). Unknown devices say
"measured only".

torch is imported inside the functions that use it: JAX ranks read `peak_rss_bytes` from here, and
loading torch into them would inflate the very peak they measure.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path

CUDA_PEAK_N = 8192  # a GEMM large enough to run at the tensor cores' rate, not at launch overhead


def matmul_peak_flops(
    dtype: str = "float32", device: str = "cpu", n: int = 2048, repeats: int = 5, iters: int | None = None
) -> float:
    """Measured FLOP/s of an n×n×n matmul (2n³ FLOPs) in `dtype` on `device`: best of `repeats`
    windows of `iters` back-to-back matmuls.

    CPU: one matmul a window (perf_counter). CUDA: n is at least CUDA_PEAK_N and each window
    times 20 matmuls between CUDA events, so kernel launch and host timer overhead (most of a
    single 2048³ matmul on an H100) stay out of the peak. On CUDA the matmul runs in whatever
    TF32 mode is set: call set_tf32 first for a TF32 cell."""
    import torch

    cuda = device.startswith("cuda")
    if cuda:
        n, iters = max(n, CUDA_PEAK_N), iters or 20
    iters = iters or 1
    dt = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    for _ in range(2 if cuda else 1):  # warm-up: thread pool / cuBLAS handle, kernel selection, clocks
        a @ b
    best = float("inf")
    for _ in range(repeats):
        best = min(best, _time_window(lambda: a @ b, iters, cuda) / iters)
    return 2 * n**3 / best


def _time_window(fn, iters: int, cuda: bool) -> float:
    """Seconds for `iters` calls of fn: CUDA events around the queued kernels, else perf_counter."""
    import torch

    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # ms -> s
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - t0


# Published dense (no 2:4 sparsity) tensor-core peaks, TFLOP/s per GPU, from NVIDIA's data
# sheets. "float32" is the plain FP32 rate; "tf32" applies to float32 matmuls with TF32 on.
# Patterns are matched against torch.cuda.get_device_name(), first match wins.
_H100_SXM = {"float64": 67.0, "float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4, "float8": 1978.9}
PUBLISHED_PEAKS_TFLOPS: list[tuple[str, str, dict[str, float]]] = [
    (
        r"H100.*(PCIe|PCIE)",
        "H100 PCIe",
        {"float64": 51.2, "float32": 51.2, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0, "float8": 1513.0},
    ),
    (r"H100(?!.*NVL)", "H100 SXM", _H100_SXM),
    (r"H200(?!.*NVL)", "H200 SXM", _H100_SXM),  # same compute as H100 SXM, more and faster memory
    (r"A100", "A100", {"float64": 19.5, "float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0}),
    (r"\bL4\b", "L4", {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0, "float16": 121.0, "float8": 242.5}),
    (r"\bT4\b", "T4", {"float32": 8.1, "float16": 65.0}),
    (r"V100.*(PCIe|PCIE)", "V100 PCIe", {"float64": 7.0, "float32": 14.0, "float16": 112.0}),
    (r"V100", "V100 SXM2", {"float64": 7.8, "float32": 15.7, "float16": 125.0}),
]


def published_peak_flops(dtype: str, device_name: str, tf32: bool = False) -> tuple[str, float | None]:
    """(the table's name for the device, its published dense peak FLOP/s for `dtype`), or
    (device_name + " (measured only)", None) for a device or dtype the table does not hold."""
    for pattern, name, peaks in PUBLISHED_PEAKS_TFLOPS:
        if re.search(pattern, device_name):
            key = "tf32" if dtype == "float32" and tf32 and "tf32" in peaks else dtype  # no TF32: plain FP32
            return (name, peaks[key] * 1e12) if key in peaks else (f"{name}: no {key} peak (measured only)", None)
    return f"{device_name} (measured only)", None


def peak_flops(dtype: str, device, n: int = 2048) -> dict:
    """The two MFU denominators of a run in `dtype` on `device`: the measured GEMM peak and the
    device's published dense peak (None off the table, and on CPUs), with the device's name."""
    import torch

    device = torch.device(device)
    out = {"measured": matmul_peak_flops(dtype, device.type, n=n)}
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32 = dtype == "float32" and torch.backends.cuda.matmul.allow_tf32
        out["published_name"], out["published"] = published_peak_flops(dtype, name, tf32)
    else:
        out["published_name"], out["published"] = "CPU (measured only)", None
    return out


def mfu(achieved_flops: float, peaks: dict) -> dict:
    """MFU against the measured GEMM peak and (NaN where unknown) the published peak."""
    pub = peaks.get("published")
    return {"mfu": achieved_flops / peaks["measured"], "mfu_published": achieved_flops / pub if pub else float("nan")}


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
    return (
        None
        if fast
        else (f"no native {dtype} matmul on this CPU (probe {low / 1e9:.1f} vs float32 {fp32 / 1e9:.0f} GFLOP/s)")
    )


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
