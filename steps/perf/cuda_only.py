"""Which perf knobs exist only on CUDA, read from a cell's params (a dict: no torch, so the Snakefile
can ask it too). On a CPU device such a cell skips before anything is built (steps/perf/step.py),
and its rule reserves one core instead of every core (workflow/rules/perf.smk): a skip is a few
seconds of imports and an MLflow run."""

from __future__ import annotations


def cuda_only_reason(params: dict) -> str:
    """Why the cell needs CUDA ('' when it runs on a CPU)."""
    if (params.get("model") or {}).get("fp8"):
        return "needs CUDA (fp8 tensor-core matmuls, compute capability 8.9+)"
    if params.get("compile") and params.get("compile_mode", "default") != "default":
        return f"needs CUDA (compile mode {params['compile_mode']} captures CUDA graphs)"
    if params.get("tf32"):
        return "needs CUDA (TF32 is an NVIDIA tensor-core matmul mode)"
    if params.get("amp") == "fp16":
        return "needs CUDA (fp16 autocast with GradScaler)"
    if params.get("fused_backend") == "triton":
        return "needs CUDA (Triton kernels)"
    return ""
