"""The one parity check every engine uses: the largest |sharded - single device| over a state.

Works on torch tensors and on numpy/JAX arrays without importing either framework (a JAX process
stays torch-free). Torch tensors are compared in float64 on the CPU: a gathered pipeline state is
on the CPU (comm.gather_state) while rank 0's reference stays on its GPU under NCCL.
"""

from __future__ import annotations

import numpy as np


def host_f64(t):
    """`t` in float64 on the host: a CPU torch tensor, or a numpy array for anything else."""
    if hasattr(t, "detach"):  # torch
        return t.detach().double().cpu()
    return np.asarray(t, np.float64)


def abs_diff(a, b):
    """|a - b| in float64 on the host."""
    return abs(host_f64(a) - host_f64(b))


def max_delta(a: dict, b: dict) -> tuple[float, str]:
    """Largest |a - b| over all tensors of two {name: tensor} states, and the name it is in."""
    if set(a) != set(b):
        raise RuntimeError(
            f"parity: names differ between sharded and reference state: only sharded "
            f"{sorted(set(a) - set(b))[:4]}, only reference {sorted(set(b) - set(a))[:4]}"
        )
    return max((float(abs_diff(a[k], b[k]).max()), k) for k in a)
