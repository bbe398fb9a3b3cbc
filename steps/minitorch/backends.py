"""Which kernel module runs a backend's four primitives (placeholder until fast/cuda land)."""

import importlib

KERNEL_MODULES = {"reference": "steps.minitorch.reference_ops"}


def available() -> tuple[str, ...]:
    return tuple(KERNEL_MODULES)


def kernels(name: str):
    if name not in KERNEL_MODULES:
        raise ValueError(f"unknown miniTorch backend {name!r}: choose one of {sorted(KERNEL_MODULES)}")
    return importlib.import_module(KERNEL_MODULES[name])


def why_unavailable(name: str) -> str:
    return f"no kernel module for {name!r} here (known: {sorted(KERNEL_MODULES)})"
