"""The Triton kernels of steps/perf/triton_kernels.py, which no GPU has run here:

1. under the Triton interpreter on CPU, forward and backward against the torch references
   (tests/triton_interpreted_cases.py, in a subprocess started with TRITON_INTERPRET=1);
2. compiled ahead of time for NVIDIA sm_80 and sm_90 (triton.compile down to a cubin with the
   ptxas that ships in the triton wheel; no GPU or driver needed): what the interpreter cannot
   show, that every dtype/accumulator variant the wrappers launch lowers for a real GPU;
3. the real (non-interpreted) path stays off on CPU, so CPU perf cells keep skipping "needs CUDA".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is a dependency on Linux x86_64 only")

from tests.conftest import check_triton_path_stays_off_on_cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_match_torch_references_under_the_interpreter():
    """Runs tests/triton_interpreted_cases.py in a fresh process with TRITON_INTERPRET=1 (it must be
    set before triton is first imported; see that file) and requires every case to pass."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-o",
        "addopts=",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rfEs",
        "tests/triton_interpreted_cases.py",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    assert proc.returncode == 0, f"interpreted kernel cases failed ({' '.join(cmd[2:])}):\n{out[-6000:]}"
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", summary)) else 0
    assert passed >= 36, f"expected the 36 interpreted cases to run, got: {summary}"
    if not torch.cuda.is_available():
        assert "skipped" not in summary, summary


# ---- compiled for real GPUs, without one ----------------------------------------------------------
def _signatures(dt: str) -> list[tuple[str, dict, dict]]:
    import triton.language as tl

    acc, stat = (tl.float64, "*fp64") if dt == "fp64" else (tl.float32, "*fp32")
    p = f"*{dt}"
    out = []
    for has_mask in (True, False):
        out.append(
            (
                "_softmax_fwd_kernel",
                {
                    "x_ptr": p,
                    "y_ptr": p,
                    "mask_ptr": "*i8" if has_mask else p,
                    "n_cols": "i32",
                    "t_q": "i32",
                    "HAS_MASK": "constexpr",
                    "ACC": "constexpr",
                    "BLOCK": "constexpr",
                },
                {"HAS_MASK": has_mask, "ACC": acc, "BLOCK": 1024},
            )
        )
    out.append(
        (
            "_softmax_bwd_kernel",
            {"y_ptr": p, "dy_ptr": p, "dx_ptr": p, "n_cols": "i32", "ACC": "constexpr", "BLOCK": "constexpr"},
            {"ACC": acc, "BLOCK": 1024},
        )
    )
    for has_bias in (True, False):
        out.append(
            (
                "_layernorm_fwd_kernel",
                {
                    "x_ptr": p,
                    "w_ptr": p,
                    "b_ptr": p,
                    "y_ptr": p,
                    "mean_ptr": stat,
                    "rstd_ptr": stat,
                    "n_cols": "i32",
                    "eps": "fp32",
                    "HAS_BIAS": "constexpr",
                    "ACC": "constexpr",
                    "BLOCK": "constexpr",
                },
                {"HAS_BIAS": has_bias, "ACC": acc, "BLOCK": 1024},
            )
        )
    out.append(
        (
            "_layernorm_bwd_dx_kernel",
            {
                "dy_ptr": p,
                "x_ptr": p,
                "w_ptr": p,
                "mean_ptr": stat,
                "rstd_ptr": stat,
                "dx_ptr": p,
                "n_cols": "i32",
                "ACC": "constexpr",
                "BLOCK": "constexpr",
            },
            {"ACC": acc, "BLOCK": 1024},
        )
    )
    return out


@pytest.mark.parametrize("arch", [80, 90], ids=lambda a: f"sm_{a}")
def test_kernels_compile_to_cubin_for_nvidia_gpus(arch, tmp_path, monkeypatch):
    """Every kernel and variant the wrappers launch (fp32/bf16/fp16 with fp32 arithmetic, fp64 with
    fp64; mask/bias on and off) goes through Triton's full pipeline to a cubin for an A100 (sm_80)
    and an H100 (sm_90). This needs no GPU; running them still does."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in triton.backends.backends:
        pytest.skip("this triton build has no NVIDIA backend")
    from steps.perf import triton_kernels as mod

    if not isinstance(triton.language.max, triton.runtime.JITFunction):
        pytest.skip("TRITON_INTERPRET=1 was set when triton was imported: nothing to compile")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compile for real, not from a cache
    for dt in ("fp32", "bf16", "fp16", "fp64"):
        for kernel, signature, constexprs in _signatures(dt):
            k = triton.compile(
                ASTSource(getattr(mod, kernel), signature, constexprs), target=GPUTarget("cuda", arch, 32)
            )
            assert k.asm["cubin"], f"{kernel} {dt}: no cubin"
            assert f".target sm_{arch}" in k.asm["ptx"], f"{kernel} {dt}: not sm_{arch}"


# ---- the real path on CPU ---------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_real_triton_path_stays_off_on_cpu():
    """triton is installed (a dependency now): the perf cells must still resolve "auto" to the
    compiled CPU kernels and skip Triton cells with "needs CUDA"."""
    check_triton_path_stays_off_on_cpu()
