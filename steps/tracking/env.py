"""A job's compute environment: one seed for every RNG, torch's thread count, the torch device.

`seed_all` seeds what is imported: stage modules import their libraries at the top, so by the time
the job seeds (once, before `run`), torch is seeded and its thread count set wherever it is used.
"""

from __future__ import annotations

import random
import sys

import numpy as np

from steps.tracking.errors import SkipCell


def seed_all(seed: int, threads: int = 0) -> None:
    """Python's, NumPy's and (if imported) torch's global RNG; torch intra-op threads if > 0."""
    random.seed(seed)
    np.random.seed(seed)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)


def torch_device(want: str):
    """torch device for common.device (cpu | cuda | auto); CUDA asked for but absent -> SkipCell."""
    import torch

    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise SkipCell("skipped: no CUDA")
    return torch.device(want)
