"""Machine facts every benchmark needs: the measured matmul peak (the MFU denominator) and
process peak memory that can be reset between phases.

MFU is only honest against a peak measured on the same device, dtype and thread count, so the
peak is measured here rather than taken from a spec sheet.
"""
from __future__ import annotations

import time
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
