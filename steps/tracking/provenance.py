"""What a run records about where it ran: the machine, package versions, the git commit, flat parameters."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

VERSIONED_PACKAGES = (
    "torch",
    "jax",
    "transformers",
    "datasets",
    "tokenizers",
    "mlflow",
    "snakemake",
    "numpy",
    "pandas",
    "gensim",
    "accelerate",
)


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# The /proc/cpuinfo flags that decide how fast bf16/fp16 run on a CPU: two hosts with the same model
# string ("Intel(R) Xeon(R) Processor") differed in AMX, and bf16 ran 2x or 0.55x fp32 accordingly.
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512fp16", "avx512f", "avx2")


def cpu_flags(cpuinfo: str | None = None) -> str:
    """Which of CPU_FLAGS this host has, space-separated in CPU_FLAGS' order ("none of ..." when it
    has none, "unknown" when /proc/cpuinfo cannot be read): a record tells host kinds apart by these."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), None)
    if line is None:
        return "unknown (no flags line in /proc/cpuinfo)"
    have = set(line.split(":", 1)[1].split())
    found = [f for f in CPU_FLAGS if f in have]
    return " ".join(found) if found else f"none of {' '.join(CPU_FLAGS)}"


def machine() -> dict[str, str]:
    """This host as a results record names it (the lab run's `machine.*` tags): CPU model, cores,
    memory, the CPU flags that decide bf16/fp16 speed, and the GPUs nvidia-smi lists ("none" without
    one). No torch import: the lab run opens before every job."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    out = {"cpu": cpu_model(), "cores": str(os.cpu_count() or 0), "memory_gib": f"{pages / 2**30:.1f}"}
    out["cpu_flags"] = cpu_flags()
    gpus = "none"
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
        try:
            listed = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        except (OSError, subprocess.SubprocessError):
            listed = []
        gpus = "; ".join(line.strip() for line in listed) or "none (nvidia-smi lists no GPU)"
    return out | {"gpus": gpus}


def git_commit() -> str:
    """HEAD (+ "-dirty"), or $N00BGPT_GIT_COMMIT where it is set: a copy of the tree whose .git is
    not its own (the GPU device machine's copy carries an older clone's .git)."""
    if os.environ.get("N00BGPT_GIT_COMMIT"):
        return os.environ["N00BGPT_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (sha or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def is_number(v) -> bool:
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        or type(v).__name__ in ("float32", "float64", "int64", "int32")
    )
