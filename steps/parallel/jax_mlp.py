"""The same plan in JAX, on N devices: N CPU host devices or N GPUs, as launch.jax_env decides
(it sets JAX_PLATFORMS, and XLA_FLAGS for host devices, before this imports jax: under device
cuda a cell runs on the first N GPUs and is skipped when there are fewer; device auto falls back
to CPU host devices). On GPUs fp32 matmuls run at "highest" precision: XLA's default there is
TF32, whose ~1e-3 rounding would swamp the 1e-5 parity check.

  jax_jit       the unsharded step + NamedSharding on params, optimizer state and batch; GSPMD
                inserts the collectives (the AXLearn style: the plan is only shardings)
  jax_shard_map the step written per device with explicit collectives: all_gather of FSDP shards,
                psum of TP partial outputs, pmean of the loss over the data axis; their transposes
                (psum_scatter, psum) are what autodiff derives for the backward pass
The model (the MLP here, GPT blocks in jax_gpt.py) supplies weights, specs and forward.
Communication is read from the compiled HLO (every all-reduce / all-gather / reduce-scatter /
collective-permute, its shape and replica-group size) in comm.py's ring convention. Parity is
against the unsharded JAX step (same weights, batches) and across backends against torch.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from steps.parallel import analytic as A
from steps.parallel.mlp_init import PARAM_NAMES, init_mlp, make_batch
from steps.parallel.plan import Plan, plan_from_argv

# strategy -> PartitionSpec per parameter kind; FSDP shards every tensor on top of TP
SPECS = {
    "single": {"w1": P(), "b1": P(), "w2": P(), "b2": P()},
    "dp": {"w1": P(), "b1": P(), "w2": P(), "b2": P()},
    "fsdp": {"w1": P("fsdp", None), "b1": P("fsdp"), "w2": P("fsdp", None), "b2": P("fsdp")},
    "tp": {"w1": P("tp", None), "b1": P("tp"), "w2": P(None, "tp"), "b2": P()},
    "fsdp_tp": {"w1": P("tp", "fsdp"), "b1": P(("tp", "fsdp")), "w2": P("fsdp", "tp"), "b2": P("fsdp")},
}
SPECS["dp_tp"] = SPECS["tp"]


def block(x, w1, b1, w2, b2, tp_axis=None):
    y = jax.nn.relu(x @ w1.T + b1) @ w2.T
    if tp_axis:  # row-parallel partial sums (Megatron's g)
        y = jax.lax.psum(y, tp_axis)
    return x + y + b2


def remat(plan: Plan, f):
    """Under FSDP free gathered weights after use, so backward gathers them again (3Ψ)."""
    return jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable) if "fsdp" in plan.mesh else f


class MLPModel:
    """What train() needs of a model: weights, a spec per weight, forward, batches, analytic costs."""

    def init(self, plan: Plan) -> dict:
        return init_mlp(**plan.mlp, seed=plan.seed)

    def spec(self, plan: Plan, name: str):
        return SPECS[plan.strategy][name.split(".")[1]]

    def batch(self, plan: Plan, t: int):
        return make_batch(plan.batch_size, plan.mlp["dim"], plan.seed, t)

    def forward(self, plan: Plan, params, x, tp, gather):
        for i in range(plan.mlp["layers"]):
            keys = [f"{i}.{p}" for p in PARAM_NAMES]

            def f(x, *ws, keys=keys):
                return block(x, *(gather(k, w) for k, w in zip(keys, ws)), tp_axis=tp)
            x = remat(plan, f)(x, *(params[k] for k in keys))
        return x

    def analytic(self, plan: Plan, shapes: dict) -> dict:
        return {"state_bytes": plan.state_tensors * A.mlp_local_params(plan) * plan.bytes_per_elem,
                "comm_bytes": A.mlp_comm(plan), "params": A.mlp_psi(plan)}

    def torch_reference(self, plan: Plan):
        """The same plan's single-device torch run (cross-backend parity)."""
        import torch
        from steps.parallel.worker import DTYPES, reference_mlp
        dtype = DTYPES[plan.dtype]
        full = {k: torch.tensor(v, dtype=dtype) for k, v in self.init(plan).items()}
        losses, _, params = reference_mlp(plan, full, dtype)
        return losses, {k: v.numpy() for k, v in params.items()}


def get_model(plan: Plan):
    if plan.model == "gpt":
        from steps.parallel.jax_gpt import GPTBlocksModel
        return GPTBlocksModel()
    return MLPModel()


def make_loss(plan: Plan, model, names, explicit: bool):
    """loss(params, x, y). explicit=True: the per-device body for shard_map."""
    specs = {k: model.spec(plan, k) for k in names}
    tp = "tp" if explicit and "tp" in plan.mesh else None
    fsdp = explicit and "fsdp" in plan.mesh

    def gather(name, t):  # FSDP: all-gather the fsdp-sharded dim right before use
        if not fsdp:
            return t
        for dim, entry in enumerate(specs[name]):
            if entry == "fsdp" or (isinstance(entry, tuple) and "fsdp" in entry):
                return jax.lax.all_gather(t, "fsdp", axis=dim, tiled=True)
        return t

    def loss(params, x, y):
        local = jnp.mean((model.forward(plan, params, x, tp, gather) - y) ** 2)
        return jax.lax.pmean(local, plan.data_axis) if explicit and plan.data_axis else local
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
        c1, c2 = 1 - b1 ** step, (1 - b2 ** step) ** 0.5
        new = {k: params[k] - (lr / c1) * m[k] / (jnp.sqrt(v[k]) / c2 + eps) for k in params}
        return new, {"m": m, "v": v}
    return init, update


def build_step(plan: Plan, model, names, mesh):
    """One jitted train step (grads returned too, for the parity check)."""
    _, update = optimizer(plan)
    sharded = mesh is not None and plan.strategy != "single"
    data = P(plan.data_axis) if plan.data_axis else P()
    if plan.backend == "jax_shard_map" and sharded:
        specs = {k: model.spec(plan, k) for k in names}
        body = make_loss(plan, model, names, explicit=True)

        def grad_fn(params, x, y):
            return jax.value_and_grad(body)(params, x, y)
        vg = jax.shard_map(grad_fn, mesh=mesh, in_specs=(specs, data, data), out_specs=(P(), specs))
    else:
        vg = jax.value_and_grad(make_loss(plan, model, names, explicit=False))

    def step(params, state, x, y, t):
        loss, grads = vg(params, x, y)
        params, state = update(params, grads, state, t)
        return params, state, loss, grads
    if not sharded:
        return jax.jit(step), None
    ps = {k: NamedSharding(mesh, model.spec(plan, k)) for k in names}
    st = {"m": ps, "v": ps} if plan.optimizer == "adam" else {"m": ps}
    ds, rep = NamedSharding(mesh, data), NamedSharding(mesh, P())
    jitted = jax.jit(step, in_shardings=(ps, st, ds, ds, rep), out_shardings=(ps, st, rep, ps))
    return jitted, (ps, st, ds)


# ---- measuring -----------------------------------------------------------------------------------
_DT = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s64": 8, "pred": 1}
_COLL = re.compile(r"=\s*(\(.*?\)|\w+\[[\d,]*\](?:\{[^}]*\})?)\s+(all-reduce|all-gather|reduce-scatter|"
                   r"collective-permute|all-to-all)(?:-start)?\(")


def _shape_bytes(text: str) -> int:
    return sum(_DT.get(dt, 4) * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
               for dt, dims in re.findall(r"(\w+)\[([\d,]*)\]", text))


def _group_size(line: str, world: int) -> int:
    m = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)  # iota form: [groups, size]<=[N]
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)  # mesh['a'=2,'b'=2] {'a'}
    if m:
        sizes = {k: int(v) for k, v in re.findall(r"'(\w+)'=(\d+)", m.group(1))}
        return int(np.prod([sizes[a] for a in re.findall(r"'(\w+)'", m.group(2))] or [1]))
    return world


def hlo_comm(hlo: str, world: int) -> tuple[float, dict]:
    """Ring-equivalent bytes per device of every collective in compiled HLO (see comm.py)."""
    total, calls = 0.0, {}
    for line in hlo.splitlines():
        m = _COLL.search(line)
        if not m or "-done" in line:
            continue
        out, op = _shape_bytes(m.group(1)), m.group(2)
        n = _group_size(line, world)
        factor = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": (n - 1),
                  "collective-permute": 1.0, "all-to-all": (n - 1) / n}[op]
        total += factor * out
        calls[op] = calls.get(op, 0) + 1
    return total, calls


def per_device_bytes(tree) -> dict:
    out: dict = {}
    for a in jax.tree.leaves(tree):
        for s in a.addressable_shards:
            out[s.device.id] = out.get(s.device.id, 0) + s.data.nbytes
    return out


def render_sharding(params: dict, mesh) -> str:
    """Which slice of each array lives on which device (jax.debug.visualize_array_sharding in text)."""
    lines = [f"mesh {dict(mesh.shape)}  devices {mesh.devices.tolist()}"]
    for k, a in params.items():
        lines.append(f"\n{k} shape {a.shape} spec {a.sharding.spec}")
        for dev, idx in sorted(a.sharding.devices_indices_map(a.shape).items(), key=lambda t: t[0].id):
            sl = ", ".join(f"{s.start or 0}:{s.stop if s.stop is not None else n}" for s, n in zip(idx, a.shape))
            lines.append(f"  device {dev.id}: [{sl}]")
    return "\n".join(lines) + "\n"


def train(plan: Plan, model, mesh=None) -> dict:
    dt = jnp.float64 if plan.dtype == "float64" else jnp.float32
    full = {k: jnp.asarray(v, dt) for k, v in model.init(plan).items()}
    names = list(full)
    step, shardings = build_step(plan, model, names, mesh)
    init, _ = optimizer(plan)
    params, state = full, init(full)
    if shardings:
        params = jax.device_put(params, shardings[0])
        state = jax.device_put(state, shardings[1])
    rec = {"losses": [], "grads": [], "step_s": []}
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
        rec["losses"].append(float(loss))
        rec["grads"].append({k: np.asarray(v) for k, v in grads.items()})
        rec["last_grads"] = grads
    rec["params"], rec["state"] = params, state
    return rec


def max_delta(a: dict, b: dict) -> float:
    return max(float(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)).max()) for k in a)


def run(plan: Plan, out: Path) -> dict:
    names = tuple(plan.mesh)
    mesh = jax.make_mesh(tuple(plan.mesh.values()), names, axis_types=(AxisType.Auto,) * len(names))
    model = get_model(plan)
    ref = train(Plan.from_params({**plan.to_dict(), "strategy": "single", "mesh": {}, "backend": "jax_jit"}), model)
    res = train(plan, model, mesh)
    comm, calls = hlo_comm(res["hlo"], plan.world)
    dev_p, dev_g = per_device_bytes(res["params"]), per_device_bytes(res["last_grads"])
    dev_o = per_device_bytes(res["state"])
    worst = max(dev_p, key=lambda d: dev_p[d] + dev_g[d] + dev_o[d])
    xb = model.torch_reference(plan) if plan.cross_backend else None
    (out / "sharding.txt").write_text(render_sharding(res["params"], mesh))
    final = {k: np.asarray(v) for k, v in res["params"].items()}
    ref_final = {k: np.asarray(v) for k, v in ref["params"].items()}
    return {
        "rank": 0, "world": plan.world, "losses": res["losses"], "step_s": res["step_s"][1:] or res["step_s"],
        "comm_bytes": [comm] * plan.steps, "comm_calls": calls,
        "dloss": [abs(a - b) for a, b in zip(res["losses"], ref["losses"])],
        "dgrad": [max_delta(a, b) for a, b in zip(res["grads"], ref["grads"])],
        "dparam": max_delta(final, ref_final),
        **({"xb_dloss": max(abs(a - b) for a, b in zip(res["losses"], xb[0])),
            "xb_dparam": max_delta(final, xb[1])} if xb else {}),
        "state_bytes": {"params": dev_p[worst], "grads": dev_g[worst], "optim": dev_o[worst]},
        "analytic": model.analytic(plan, {k: int(v.size) for k, v in final.items()}),
        "peak_rss_bytes": _peak_rss(),
        "notes": f"{plan.world} {jax.default_backend()} device(s); HLO collectives "
                 + ", ".join(f"{k}×{v}" for k, v in calls.items()),
    }


def _peak_rss() -> int:
    from steps import hardware
    return hardware.peak_rss_bytes()


def main() -> None:
    plan, out = plan_from_argv()
    if plan.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    if jax.default_backend() == "gpu":  # TF32 by default there: full fp32 for the parity check
        jax.config.update("jax_default_matmul_precision", "highest")
    if plan.backend == "jax_lessons":
        from steps.parallel.jax_lessons import run as lessons
        rec = lessons(plan, out)
    else:
        rec = run(plan, out)
    (out / "rank0.json").write_text(json.dumps(rec, indent=1, default=float))


if __name__ == "__main__":
    main()
