"""The JAX engines (DeviceEngine in engines.py): one process, every device of the mesh. On GPUs
fp32 matmuls run at "highest" precision (set by __main__.py): XLA's default there is TF32, whose
~1e-3 rounding would swamp the 1e-5 parity check.

  JitEngine       the unsharded step + NamedSharding on params, optimizer state and batch; GSPMD
                  inserts the collectives (the AXLearn style: the plan is only shardings)
  ShardMapEngine  the step written per device with explicit collectives: all_gather of FSDP
                  shards, psum of TP partial outputs, pmean of the loss over the data axis; their
                  transposes (psum_scatter, psum) are what autodiff derives for the backward pass
The model (toy_mlp.py, gpt_blocks.py, moe_blocks.py) supplies weights, specs and forward. Parity is
against the unsharded step on one device (same weights, batches), shard by shard on every device
(each copy of a replicated array is checked, and the copies against each other), and, with
cross_backend (every configured JAX cell), against torch's single-device run of the same plan at the
same tolerance: that check decides the verdict too (parity.KINDS "xbackend").
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from steps import hardware
from steps.sharding.jax.gpt_blocks import GPTBlocksModel
from steps.sharding.jax.measure import hlo_comm, per_device_bytes, render_sharding
from steps.sharding.jax.moe_blocks import MoEBlocksModel
from steps.sharding.jax.toy_mlp import MLPModel
from steps.sharding.parity import max_delta, max_delta_shards
from steps.sharding.plan import Plan

MODELS = {"mlp": MLPModel, "gpt": GPTBlocksModel}


def model_for(plan: Plan):
    """The plan's JAX model: the MLP, our GPT's blocks, or (gpt.moe) MoE blocks."""
    return MoEBlocksModel() if plan.model == "gpt" and plan.gpt.get("moe") else MODELS[plan.model]()


def data_spec(plan: Plan):
    """The batch's PartitionSpec: rows over every data axis (both dp and fsdp under HSDP)."""
    return P(plan.data_axes) if plan.data_axes else P()


def make_loss(plan: Plan, model, names, explicit: bool):
    """loss(params, x, y). explicit=True: the per-device body for shard_map."""
    specs = {k: model.spec(plan, k) for k in names}
    tp = "tp" if explicit and "tp" in plan.mesh else None
    ep = {"ep": "ep"} if explicit and "ep" in plan.mesh else {}  # MoE blocks only: the all_to_all axis
    fsdp = explicit and "fsdp" in plan.mesh

    def gather(name, t):  # FSDP: all-gather the fsdp-sharded dim right before use
        if not fsdp:
            return t
        for dim, entry in enumerate(specs[name]):
            if entry == "fsdp" or (isinstance(entry, tuple) and "fsdp" in entry):
                return jax.lax.all_gather(t, "fsdp", axis=dim, tiled=True)
        return t

    def loss(params, x, y):
        local = jnp.mean((model.forward(plan, params, x, tp, gather, **ep) - y) ** 2)
        return jax.lax.pmean(local, plan.data_axes) if explicit and plan.data_axes else local

    return loss


def optimizer(plan: Plan):
    """torch.optim.Adam / SGD(momentum=0.9) written out, so both backends do the same arithmetic."""
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, plan.lr

    def init(params):
        z = {k: jnp.zeros_like(v) for k, v in params.items()}
        return {"m": z, "v": dict(z)} if plan.optimizer == "adam" else {"m": z}

    def update(params, grads, state, step):
        if plan.optimizer == "sgd":
            m = {k: jnp.where(step == 1, grads[k], 0.9 * state["m"][k] + grads[k]) for k in params}
            return {k: params[k] - lr * m[k] for k in params}, {"m": m}
        m = {k: state["m"][k] + (grads[k] - state["m"][k]) * (1 - b1) for k in params}
        v = {k: state["v"][k] * b2 + grads[k] * grads[k] * (1 - b2) for k in params}
        c1, c2 = 1 - b1**step, (1 - b2**step) ** 0.5
        new = {k: params[k] - (lr / c1) * m[k] / (jnp.sqrt(v[k]) / c2 + eps) for k in params}
        return new, {"m": m, "v": v}

    return init, update


def maybe_diverge(plan: Plan, params: dict, t: int) -> dict:
    """Test fixture (fault.diverge_rank, as worker.maybe_diverge): after step fault.at_step, the copy
    on device diverge_rank of the first parameter gets fault.diverge_by added to one element."""
    f = plan.fault
    if f.diverge_rank < 0 or t != f.at_step:
        return params
    name = next(iter(params))
    a = params[name]
    parts = [
        s.data.at[(0,) * s.data.ndim].add(float(f.diverge_by))
        if s.device.id == f.diverge_rank and s.data.size
        else s.data
        for s in a.addressable_shards
    ]
    return {**params, name: jax.make_array_from_single_device_arrays(a.shape, a.sharding, parts)}


def cross_backend(losses: list, final: dict, torch_run: tuple) -> dict:
    """This cell's losses and final parameters against the torch single-device run of the same plan
    (losses, params): xb_err, the worse of the two, joins the parity verdict (parity.KINDS)."""
    dloss = max(abs(a - b) for a, b in zip(losses, torch_run[0]))
    dparam, where = max_delta(final, torch_run[1])
    return {"xb_dloss": dloss, "xb_dparam": dparam, "xb_err": max(dloss, dparam), "xb_where": where}


class JaxEngine:
    """One JAX cell: the single-device reference, the sharded run, and what it measured. Subclasses
    differ only in value_and_grad; by default the single-device loss, as jit alone compiles it."""

    def __init__(self, plan: Plan):
        self.plan, self.model = plan, model_for(plan)

    def value_and_grad(self, names, mesh, sharded: bool):
        return jax.value_and_grad(make_loss(self.plan, self.model, names, explicit=False))

    def build_step(self, names, mesh):
        """One jitted train step (grads returned too, for the parity check)."""
        plan, model = self.plan, self.model
        _, update = optimizer(plan)
        sharded = mesh is not None and plan.strategy != "single"
        vg = self.value_and_grad(names, mesh, sharded)

        def step(params, state, x, y, t):
            loss, grads = vg(params, x, y)
            params, state = update(params, grads, state, t)
            return params, state, loss, grads

        if not sharded:
            return jax.jit(step), None
        ps = {k: NamedSharding(mesh, model.spec(plan, k)) for k in names}
        st = {"m": ps, "v": ps} if plan.optimizer == "adam" else {"m": ps}
        ds, rep = NamedSharding(mesh, data_spec(plan)), NamedSharding(mesh, P())
        jitted = jax.jit(step, in_shardings=(ps, st, ds, ds, rep), out_shardings=(ps, st, rep, ps))
        return jitted, (ps, st, ds)

    def train(self, mesh=None) -> dict:
        plan, model = self.plan, self.model
        dt = jnp.float64 if plan.dtype == "float64" else jnp.float32
        full = {k: jnp.asarray(v, dt) for k, v in model.init(plan).items()}
        names = list(full)
        step, shardings = self.build_step(names, mesh)
        init, _ = optimizer(plan)
        params, state = full, init(full)
        if shardings:
            params = jax.device_put(params, shardings[0])
            state = jax.device_put(state, shardings[1])
        rec = {"losses": [], "loss_arrays": [], "grads": [], "step_s": []}
        for t in range(plan.steps):
            x, y = (jnp.asarray(a, dt) for a in model.batch(plan, t))
            if shardings:
                x, y = jax.device_put(x, shardings[2]), jax.device_put(y, shardings[2])
            if t == 0 and shardings:
                rec["hlo"] = step.lower(params, state, x, y, jnp.asarray(1, dt)).compile().as_text()
            t0 = time.perf_counter()  # the step count is traced: a Python int would recompile every step
            params, state, loss, grads = step(params, state, x, y, jnp.asarray(t + 1, dt))
            jax.block_until_ready(params)
            rec["step_s"].append(time.perf_counter() - t0)
            if shardings:
                params = maybe_diverge(plan, params, t)
            rec["losses"].append(float(loss))
            rec["loss_arrays"].append({"loss": loss})
            rec["grads"].append(grads)  # jax arrays: every device's shard is checked
        rec["params"], rec["state"] = params, state
        return rec

    def reference(self) -> dict:
        """The unsharded step on one device (jit, no shardings), same weights and batches."""
        single = {**self.plan.to_dict(), "strategy": "single", "mesh": {}, "backend": "jax_jit"}
        return JitEngine(Plan.from_params(single)).train()

    def run(self, out: Path) -> dict:
        plan = self.plan
        names = tuple(plan.mesh)
        mesh = jax.make_mesh(tuple(plan.mesh.values()), names, axis_types=(AxisType.Auto,) * len(names))
        ref = self.reference()
        res = self.train(mesh)
        comm, calls = hlo_comm(res["hlo"], plan.world)
        dev_p, dev_g = per_device_bytes(res["params"]), per_device_bytes(res["grads"][-1])
        dev_o = per_device_bytes(res["state"])
        worst = max(dev_p, key=lambda d: dev_p[d] + dev_g[d] + dev_o[d])
        xb = self.model.torch_reference(plan) if plan.cross_backend else None
        (out / "sharding.txt").write_text(render_sharding(res["params"], mesh))
        final = {k: np.asarray(v) for k, v in res["params"].items()}
        ref_final = {k: np.asarray(v) for k, v in ref["params"].items()}
        dloss = [max_delta_shards(a, {"loss": r})[0] for a, r in zip(res["loss_arrays"], ref["losses"])]
        dgrad = [max_delta_shards(g, r) for g, r in zip(res["grads"], ref["grads"])]
        dparam, dparam_where, spread = max_delta_shards(res["params"], ref_final)
        return {
            "rank": 0,
            "world": plan.world,
            "losses": res["losses"],
            "step_s": res["step_s"][1:] or res["step_s"],
            "comm_bytes": [comm] * plan.steps,
            "comm_calls": calls,
            "dloss": dloss,
            "dgrad": [d[0] for d in dgrad],
            "dgrad_where": max(dgrad)[1],
            "dparam": dparam,
            "dparam_where": dparam_where,
            **dict(zip(("replica_spread", "replica_where"), max([spread] + [d[2] for d in dgrad]))),
            **(cross_backend(res["losses"], final, xb) if xb else {}),
            "state_bytes": {"params": dev_p[worst], "grads": dev_g[worst], "optim": dev_o[worst]},
            "analytic": self.model.analytic(plan, {k: int(v.size) for k, v in final.items()}),
            "peak_rss_bytes": hardware.peak_rss_bytes(),
            "notes": f"{plan.world} {jax.default_backend()} device(s); HLO collectives "
            + ", ".join(f"{k}×{v}" for k, v in calls.items()),
        }


class JitEngine(JaxEngine):
    """GSPMD: the single-device loss under jit; NamedShardings on params, optimizer state and
    batch make the compiler partition it and insert the collectives."""


class ShardMapEngine(JaxEngine):
    """The per-device body under jax.shard_map: explicit all_gather / psum / pmean (make_loss)."""

    def value_and_grad(self, names, mesh, sharded: bool):
        if not sharded:
            return super().value_and_grad(names, mesh, sharded)
        plan, model = self.plan, self.model
        specs = {k: model.spec(plan, k) for k in names}
        data = data_spec(plan)
        body = make_loss(plan, model, names, explicit=True)

        def grad_fn(params, x, y):
            return jax.value_and_grad(body)(params, x, y)

        return jax.shard_map(grad_fn, mesh=mesh, in_specs=(specs, data, data), out_specs=(P(), specs))
