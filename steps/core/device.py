"""The torch device of a job, from `common.device`: torch is imported when a stage asks for it."""

from __future__ import annotations

from steps.core.errors import SkipCell


def torch_device(want: str):
    """torch device for common.device (cpu | cuda | auto); CUDA asked for but absent -> SkipCell."""
    import torch

    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise SkipCell("skipped: no CUDA")
    return torch.device(want)
