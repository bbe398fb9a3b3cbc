"""components: every hand-written piece of the GPT against an independent reference.

Softmax/linear/LayerNorm/RMSNorm autograd Functions (forward vs torch and NumPy, backward vs
autograd, Jacobian vs finite differences, gradcheck), sinusoidal PE (vs transformers' XLM table),
both RoPE layouts (vs transformers' GPT-J and Llama rotary code), masks, attention paths, GELUs,
SwiGLU and grouped-query attention (vs transformers' LlamaMLP and repeat_kv). All float64.
Other modules add rows with steps.models.checks.register_parity; list them in `extra_modules`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pandas as pd

from steps.config.typed import Section
from steps.core import Stage, StageRun
from steps.models.checks import parity_rows
from steps.presentation.components import SHOWN


@dataclass(frozen=True, kw_only=True)
class ComponentsConfig(Section):
    """The components section (defaults: workflow/schemas/components.schema.yaml)."""

    extra_modules: tuple[str, ...]  # importing them registers more checks (register_parity)
    fail_on_mismatch: bool
    job_threads: int  # cores its rule reserves and torch's threads (0 = the global threads)


def run(ctx: StageRun) -> dict:
    p = ComponentsConfig.of(ctx.params)
    ctx.use_threads(p.job_threads)
    for name in p.extra_modules:
        importlib.import_module(name)  # registers its checks via @register_parity
    df = pd.DataFrame(parity_rows(p))
    ctx.log_table(df, "parity")
    failed = df[~df["pass"]]
    for _, r in failed.iterrows():
        print(f"FAIL {r.component} vs {r.reference}: {r.max_abs_err:.3g} > {r.tolerance:g}")
    ratio = (df.max_abs_err / df.tolerance.where(df.tolerance > 0)).max()
    ctx.info["failed"] = [f"{r.component} vs {r.reference}" for _, r in failed.iterrows()]
    if len(failed) and p.fail_on_mismatch:
        raise AssertionError(f"{len(failed)} parity checks failed: {ctx.info['failed']}")
    return {
        "n_checks": len(df),
        "n_pass": int(df["pass"].sum()),
        "all_pass": float(failed.empty),
        "worst_err_over_tol": float(ratio),
    }


STAGE = Stage.of(__spec__.name, run, SHOWN)

if __name__ == "__main__":
    STAGE.main()
