"""A JAX cell's process: `python -m steps.sharding.jax --plan JSON --out DIR` (launch.jax_cmd).

launch.jax_env sets JAX_PLATFORMS (and XLA_FLAGS for N host devices) in this process's
environment, so jax is first imported here, after them. The plan's engine (engines.py: JitEngine,
ShardMapEngine or Lessons) runs the cell; its record is DIR/rank0.json. Nothing imports this module.
"""

from __future__ import annotations

import json

import jax

from steps import lifeline
from steps.sharding import engines
from steps.sharding.plan_cli import plan_from_argv


def main() -> None:
    lifeline.die_with_owner()  # the cell's process never outlives the job that launched it
    plan, out = plan_from_argv()
    if plan.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    if jax.default_backend() == "gpu":  # TF32 by default there: full fp32 for the parity check
        jax.config.update("jax_default_matmul_precision", "highest")
    rec = engines.load(plan)(plan).run(out)
    (out / "rank0.json").write_text(json.dumps(rec, indent=1, default=float))


if __name__ == "__main__":
    main()
