"""The parity harness: the registry of checks, one row per comparison, and the function rows
(forward vs torch and NumPy, backward vs autograd, Jacobian vs finite differences)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

PARITY_CHECKS: list[Callable[..., list[dict]]] = []


def register_parity(fn: Callable[..., list[dict]]):
    PARITY_CHECKS.append(fn)
    return fn


def row(component: str, reference: str, a, b, tol: float) -> dict:
    a = a.detach().double().numpy() if torch.is_tensor(a) else np.asarray(a, dtype=np.float64)
    b = b.detach().double().numpy() if torch.is_tensor(b) else np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"{component} vs {reference}: shapes {a.shape} != {b.shape}")
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    return {
        "component": component,
        "reference": reference,
        "max_abs_err": err,
        "tolerance": tol,
        "pass": bool(err <= tol),
    }


def jacobian_fd_error(f, inputs, eps: float = 1e-6) -> float:
    """Max |J_analytic - J_numeric| over every differentiable input: our backward against
    central finite differences (what gradcheck tests, but reporting the size of the gap)."""
    worst = 0.0
    for i, x in enumerate(inputs):
        if not (torch.is_tensor(x) and x.requires_grad):
            continue

        def fi(xi, i=i):
            return f(*[xi if j == i else v for j, v in enumerate(inputs)])

        analytic = torch.autograd.functional.jacobian(fi, x)
        with torch.no_grad():
            y0 = fi(x.detach())
            numeric = torch.zeros(y0.numel(), x.numel(), dtype=torch.float64)
            flat = x.detach().clone().view(-1)
            for k in range(flat.numel()):
                d = torch.zeros_like(flat)
                d[k] = eps
                numeric[:, k] = ((fi((flat + d).view_as(x)) - fi((flat - d).view_as(x))) / (2 * eps)).reshape(-1)
        worst = max(worst, float((analytic.detach().reshape(y0.numel(), -1) - numeric).abs().max()))
    return worst


def function_rows(name, ours, ref, ours_np, inputs, np_inputs, fwd_tol=1e-12, grad_tol=1e-10):
    """Forward vs torch and NumPy, backward vs torch autograd, Jacobian vs finite differences,
    and torch.autograd.gradcheck — all float64."""
    rows = [row(name, "torch (fp64)", ours(*inputs), ref(*inputs), fwd_tol)]
    if ours_np is not None:
        rows.append(row(name + " (NumPy twin)", "torch (fp64)", ours_np(*np_inputs), ref(*inputs), fwd_tol))
    diff = [x for x in inputs if torch.is_tensor(x) and x.requires_grad]
    g = torch.randn_like(ours(*inputs))
    ga = torch.autograd.grad(ours(*inputs), diff, g)
    gb = torch.autograd.grad(ref(*inputs), diff, g)
    err = max(float((a - b).abs().max()) for a, b in zip(ga, gb))
    rows.append(row(name + " backward", "torch autograd (fp64)", err, 0.0, grad_tol))
    # gradcheck only says yes/no; the error column is the same Jacobian gap measured by hand
    ok = torch.autograd.gradcheck(ours, tuple(inputs), eps=1e-6, atol=1e-5, raise_exception=False)
    r = row(
        name + " backward", "torch.autograd.gradcheck (finite differences)", jacobian_fd_error(ours, inputs), 0.0, 1e-5
    )
    rows.append({**r, "pass": r["pass"] and bool(ok)})
    return rows


def _t(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


def parity_rows(params=None, checks=None) -> list[dict]:
    """Every registered check's rows (or just `checks`), float64 throughout; each check is handed
    `params`, the components section (steps.components.ComponentsConfig; {} when None)."""
    params = params or {}
    rows = []
    for fn in checks or PARITY_CHECKS:
        rows += fn(params)
    return rows
