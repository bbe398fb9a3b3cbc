"""The fused kernels (steps/perf/fused.py) against the unfused ops: scaled max |Δ| of values and
of every input gradient, per backend. Also rows of the components parity table: the components
stage imports this module (`components.extra_modules`), which registers them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from steps.models.attention import causal_mask
from steps.models.checks import register_parity
from steps.models.softmax import softmax as unfused_softmax
from steps.perf.fused import FusedLayerNormFunction, fused_softmax, resolve_backend


@register_parity
def fused_kernel_parity(params) -> list[dict]:
    """Rows for the components parity table: float64, the backend the perf cells run here.
    The error is max |Δ| over max(|reference|, 1) for values and all gradients."""
    return [
        {
            "component": f"{r['component']} [{r['backend']}]",
            "reference": r["reference"],
            "max_abs_err": max(r["max_err"], r["max_err_grad"]),
            "tolerance": r["tol"],
            "pass": r["ok"],
        }
        for r in parity_rows(dtype=torch.float64, tol=1e-10)
    ]


def max_diff(a, b) -> float:
    """max |a - b| relative to the reference's scale (max(|b|, 1)): weight gradients are sums
    over many rows, so an absolute tolerance would be meaningless for them."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1.0))


def compare(fn, ref, inputs: list[torch.Tensor], seed: int = 0) -> tuple[float, float]:
    """Scaled max |Δ| of outputs and of all input gradients for the same upstream gradient."""
    outs, grads = [], []
    for f in (fn, ref):
        xs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        y = f(*xs)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y)
        y.backward(g)
        outs.append(y.detach())
        grads.append([x.grad for x in xs if x.grad is not None])
    return max_diff(*outs), max(max_diff(a, b) for a, b in zip(*grads))


def parity_rows(
    backend: str = "auto", device: str = "cpu", dtype=torch.float32, shape=(2, 4, 64, 64), tol: float = 1e-5
) -> list[dict]:
    """Fused vs unfused softmax (causal mask) and LayerNorm: scaled max |Δ| of values and grads."""

    backend = resolve_backend(backend, device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(device, dtype)
    mask = causal_mask(shape[-2], shape[-1], device)
    d = shape[-1]
    h = torch.randn(shape[0], shape[2], d, generator=gen).to(device, dtype)
    w = (1 + 0.1 * torch.randn(d, generator=gen)).to(device, dtype)
    b = (0.1 * torch.randn(d, generator=gen)).to(device, dtype)
    cases = [
        (
            "fused softmax (masked)",
            "steps.models.softmax.Softmax",
            lambda t: fused_softmax(t, mask, backend=backend),
            lambda t: unfused_softmax(t, mask),
            [x],
        ),
        (
            "fused LayerNorm",
            "torch.nn.functional.layer_norm",
            lambda t, w_, b_: FusedLayerNormFunction.apply(t, w_, b_, 1e-5, backend),
            lambda t, w_, b_: F.layer_norm(t, (d,), w_, b_, 1e-5),
            [h, w, b],
        ),
    ]
    rows = []
    for name, ref_name, fn, ref, inputs in cases:
        dv, dg = compare(fn, ref, inputs)
        rows.append(
            {
                "component": name,
                "reference": ref_name,
                "backend": backend,
                "dtype": str(dtype).removeprefix("torch."),
                "max_err": dv,
                "max_err_grad": dg,
                "tol": tol,
                "ok": max(dv, dg) <= tol,
            }
        )
    return rows
