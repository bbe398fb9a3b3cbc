"""The seed's JAX lessons as measurements (the jax_lessons backend: run in the JAX cell's process,
on N host devices or N GPUs as launch.jax_env decides). Apart from the engines: this module may
import the engine, never the other way.

  jit      the same MLP loss eager (op by op) vs jax.jit (one fused XLA program)
  branch   Python `if` on a traced value fails under jit; branching on a static argument
           compiles once per value; lax.cond compiles once and traces both branches
  sharding a text rendering of where each slice of an array lives for several PartitionSpecs
"""

from __future__ import annotations

import contextlib
import io
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from steps.paired import MIN_PAIRS, interleave, ratio_of_pairs
from steps.sharding.jax.engine import make_loss
from steps.sharding.jax.toy_mlp import MLPModel
from steps.sharding.plan import Plan
from steps.sharding.toy_mlp_init import init_plan_mlp, make_batch


def jit_speedup(plan: Plan) -> dict:
    params = {k: jnp.asarray(v, jnp.float32) for k, v in init_plan_mlp(plan).items()}
    x, y = (jnp.asarray(a, jnp.float32) for a in make_batch(plan.batch_size, plan.mlp.dim, plan.seed, 0))
    single = Plan.from_params({**plan.to_dict(), "backend": "jax_jit", "strategy": "single", "mesh": {}})
    grad = jax.value_and_grad(make_loss(single, MLPModel(), list(params), explicit=False))
    jitted = jax.jit(grad)

    def eager():
        with jax.disable_jit():
            jax.block_until_ready(grad(params, x, y)[0])

    def fused():
        jax.block_until_ready(jitted(params, x, y)[0])

    # side by side (A B / B A, steps/paired.py); the warm-up pair compiles the jitted one
    jit_s, eager_s = interleave(fused, eager, pairs=MIN_PAIRS, warmup=1)
    ratio = ratio_of_pairs(jit_s, eager_s)
    return {
        "eager_step_s": statistics.median(eager_s),
        "jit_step_s": statistics.median(jit_s),
        **ratio.as_metrics("jit_speedup"),
    }


def branching() -> dict:
    traces = {"static": 0, "cond": 0}

    def python_if(x):
        return x * 2 if x.sum() > 0 else x - 1  # bool() of a tracer

    try:
        jax.jit(python_if)(jnp.ones(4))
        python_if_fails = 0
    except jax.errors.TracerBoolConversionError:
        python_if_fails = 1

    def static_branch(x, positive):
        traces["static"] += 1  # runs once per trace = once per compiled variant
        return x * 2 if positive else x - 1

    def cond_branch(x):
        traces["cond"] += 1
        return jax.lax.cond(x.sum() > 0, lambda v: v * 2, lambda v: v - 1, x)

    f_static = jax.jit(static_branch, static_argnums=1)
    f_cond = jax.jit(cond_branch)
    for sign in (1.0, -1.0, 1.0):  # three calls, two distinct branch values
        v = jnp.full(4, sign)
        f_static(v, sign > 0)
        f_cond(v)
    counts = dict(traces)  # before the check below, which traces again
    v = jnp.full(4, -1.0)
    agree = bool(jnp.allclose(f_cond(v), f_static(v, False)))
    return {
        "python_if_under_jit_fails": python_if_fails,
        "static_branch_compiles": counts["static"],
        "lax_cond_compiles": counts["cond"],
        "cond_matches_python": float(agree),
    }


def sharding_text(devices: int) -> str:
    """jax.debug.visualize_array_sharding (rich) for an (8, 8) array under several specs."""
    n = devices
    shape = (2, n // 2) if n >= 4 and n % 2 == 0 else (n,)
    names = ("data", "model")[: len(shape)]
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
    specs = [P(), P("data"), P(None, "data")] + ([P("data", "model"), P(("data", "model"))] if len(shape) == 2 else [])
    buf = io.StringIO()
    for spec in specs:
        a = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, spec))
        buf.write(f"\nmesh {dict(mesh.shape)}  PartitionSpec{tuple(spec)}\n")
        with contextlib.redirect_stdout(buf):  # rich prints one box per shard, labelled with its devices
            jax.debug.visualize_array_sharding(a, use_color=False)
    return buf.getvalue()


class Lessons:
    """The jax_lessons cell (a DeviceEngine, engines.py)."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def run(self, out: Path) -> dict:
        plan = self.plan
        rec = {"rank": 0, "world": plan.world, "mesh": plan.mesh_str}
        rec.update(jit_speedup(plan))
        rec.update(branching())
        n = min(plan.world, len(jax.devices()))  # the mesh's devices, not every visible GPU
        (out / "sharding_lessons.txt").write_text(sharding_text(n))
        rec["devices"], rec["platform"] = n, jax.default_backend()
        rec["notes"] = (
            f"jit {rec['jit_speedup']:.0f}× [{rec['jit_speedup_low']:.0f}, {rec['jit_speedup_high']:.0f}] eager's "
            f"speed ({rec['jit_speedup_pairs']:.0f} pairs side by side); Python if on a tracer fails; "
            f"static branch compiled {rec['static_branch_compiles']}× for 3 calls, lax.cond "
            f"{rec['lax_cond_compiles']}×"
        )
        return rec
