"""One seed for every RNG a job uses, and torch's thread count.

`seed_all` seeds what is imported: stage modules import their libraries at the top, so by the time
the job seeds (once, before `run`), torch is seeded and its thread count set wherever it is used.
"""

from __future__ import annotations

import random
import sys

import numpy as np


def seed_all(seed: int, threads: int = 0) -> None:
    """Python's, NumPy's and (if imported) torch's global RNG; torch intra-op threads if > 0."""
    random.seed(seed)
    np.random.seed(seed)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)
