"""One rank of a sharding cell: `torchrun ... -m steps.parallel.worker --plan JSON --out DIR`.

Every rank trains K steps under the plan; rank 0 also trains the single-device reference on
the same global batches from the same weights and compares loss, gradients (every step) and
parameters (after K steps). Each rank writes DIR/rank<r>.json; the parent (launch.py) gathers.
"""
from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from steps import hardware
from steps.parallel import comm
from steps.parallel.plan import Plan, plan_from_argv

DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ---- the from-scratch engines (the MLP) -------------------------------------------------------
class ScratchEngine:
    """Wraps one of dp/tp/fsdp/pp behind train_step / full_state / local tensors."""

    def __init__(self, plan: Plan, full: dict[str, torch.Tensor]):
        from steps.parallel.dp import DataParallel
        from steps.parallel.fsdp import FullyShardedMLP
        from steps.parallel.mlp import MLP
        from steps.parallel.pp import PipelineMLP
        from steps.parallel.tp import TensorParallelMLP

        self.plan, s = plan, plan.strategy
        self.data_rank, self.data_size = 0, 1
        if s == "dp":
            self.model = DataParallel(MLP(full))
            self.data_rank, self.data_size = dist.get_rank(), dist.get_world_size()
        elif s == "fsdp":
            self.model = FullyShardedMLP(full)
            self.data_rank, self.data_size = dist.get_rank(), dist.get_world_size()
        elif s == "tp":
            self.model = TensorParallelMLP(full)
        elif s == "dp_tp":
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(torch.get_default_device().type, tuple(plan.mesh.values()), mesh_dim_names=tuple(plan.mesh))
            self.model = DataParallel(TensorParallelMLP(full, mesh.get_group("tp")), mesh.get_group("dp"))
            self.data_rank, self.data_size = mesh.get_local_rank("dp"), plan.axis("dp")
        elif s == "pp":
            self.model = PipelineMLP(full, plan.schedule, plan.microbatches)
        else:
            raise ValueError(f"torch_scratch has no strategy {s!r} (fsdp_tp: use torch_native or jax)")

    def batch(self, step: int, dtype):
        from steps.parallel.mlp import make_batch
        x, y = (torch.tensor(a, dtype=dtype) for a in make_batch(self.plan.batch_size, self.plan.mlp["dim"],
                                                                  self.plan.seed, step))
        return tuple(t.chunk(self.data_size)[self.data_rank] for t in (x, y))

    def train_step(self, batch) -> torch.Tensor:
        from steps.parallel.mlp import loss_fn
        if self.plan.strategy == "pp":
            return self.model.train_step(*batch)
        loss = loss_fn(self.model(batch[0]), batch[1])
        loss.backward()
        if hasattr(self.model, "sync_grads"):
            self.model.sync_grads()
        return loss.detach()

    def full_state(self, kind: str) -> dict[str, torch.Tensor]:
        m = self.model
        return m.full_state(kind) if hasattr(m, "full_state") else m.named_full(kind)

    def analytic(self) -> dict:
        from steps.parallel import analytic as A
        local = A.mlp_local_params(self.plan)
        return {"state_bytes": self.plan.state_tensors * local * self.plan.bytes_per_elem, "comm_bytes": A.mlp_comm(self.plan),
                "params": A.mlp_psi(self.plan)}


def reference_mlp(plan: Plan, full, dtype):
    """Single device, same weights and global batches: per-step losses and grads, final params."""
    from steps.parallel.mlp import MLP, loss_fn, make_batch
    model = MLP(full)
    opt = plan.optimizer_for(model.parameters())
    losses, grads = [], []
    for step in range(plan.steps):
        x, y = (torch.tensor(a, dtype=dtype) for a in make_batch(plan.batch_size, plan.mlp["dim"], plan.seed, step))
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        losses.append(loss.item())
        grads.append(model.named_full("grad"))
        opt.step()
    return losses, grads, model.named_full("param")


# ---- the shared loop ---------------------------------------------------------------------------
def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def state_bytes(params, opt) -> dict:
    """Params, grads and optimizer moments this rank holds (DTensor: its local shard)."""
    moments = [v for p in params for k, v in opt.state[p].items() if k in ("exp_avg", "exp_avg_sq", "momentum_buffer")]
    return {"params": local_bytes(params), "grads": local_bytes(p.grad for p in params),
            "optim": local_bytes(moments)}


def abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in float64 on the CPU: a gathered pipeline state is on the CPU (comm.gather_state)
    while the reference and the other engines' states stay on this rank's GPU under NCCL."""
    return (a.detach().double().cpu() - b.detach().double().cpu()).abs()


def max_delta(a: dict, b: dict) -> tuple[float, str]:
    """Largest |a - b| over all tensors, and the tensor it is in."""
    missing = set(a) ^ set(b)
    if missing:
        raise RuntimeError(f"parity: names differ between sharded and reference state: only sharded {sorted(set(a) - set(b))[:4]}, only reference {sorted(set(b) - set(a))[:4]}")
    return max((float(abs_diff(a[k], b[k]).max()), k) for k in a)


def device_sync() -> None:
    """Wait for this rank's GPU before reading the clock: kernels and NCCL collectives run
    asynchronously, so without it a step's time is the time to launch it. No-op on the CPU."""
    if torch.get_default_device().type == "cuda":  # main() sets it under NCCL
        torch.cuda.synchronize()


def maybe_fault(plan: Plan, rank: int, step: int) -> None:
    """Deliberate failure for the launcher's fail-fast test: a rank that exits or hangs."""
    f = plan.fault
    if f.get("kill_rank", -1) == rank and step == f.get("at_step", 1):
        if f.get("mode", "exit") == "hang":
            time.sleep(10 ** 6)
        os._exit(17)


def run(plan: Plan, out: Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[plan.dtype]
    torch.manual_seed(plan.seed)
    if plan.backend == "torch_native":
        from steps.parallel.native import NativeEngine, reference
        engine = NativeEngine(plan, dtype)
        ref = reference(plan, dtype) if rank == 0 else None
    else:
        from steps.parallel.mlp import init_mlp
        full = {k: torch.tensor(v, dtype=dtype) for k, v in init_mlp(**plan.mlp, seed=plan.seed).items()}
        engine = ScratchEngine(plan, full)
        ref = reference_mlp(plan, full, dtype) if rank == 0 else None
    params = [p for p in engine.model.parameters() if p.requires_grad]
    opt = plan.optimizer_for(params)
    counter = comm.COUNTER
    mode = comm.NativeCommMode(counter, world) if plan.backend == "torch_native" else None
    rec = {"rank": rank, "world": world, "losses": [], "step_s": [], "comm_bytes": [], "dgrad": [], "dloss": []}
    hardware.reset_peak_rss()
    for step in range(plan.steps):
        maybe_fault(plan, rank, step)
        batch = engine.batch(step, dtype)
        dist.barrier()
        device_sync()
        counter.reset()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if mode is not None:
            with mode:
                loss = engine.train_step(batch)
        else:
            loss = engine.train_step(batch)
        opt.step()
        device_sync()
        rec["step_s"].append(time.perf_counter() - t0)
        rec["comm_bytes"].append(counter.bytes)
        rec["comm_calls"], rec["comm_detail"] = dict(counter.calls), dict(counter.detail)
        loss = loss.detach().clone().to(dtype)
        dist.all_reduce(loss)  # reporting only: the mean of the ranks' losses (equal slices)
        rec["losses"].append(loss.item() / world)
        grads = engine.full_state("grad")
        if rank == 0:
            rec["dloss"].append(abs(rec["losses"][-1] - ref[0][step]))
            delta, name = max_delta(grads, ref[1][step])
            rec["dgrad"].append(delta)
            rec["dgrad_where"] = name
    rec["peak_rss_bytes"] = hardware.peak_rss_bytes()
    rec["state_bytes"] = state_bytes(params, opt)
    final = engine.full_state("param")
    if rank == 0:
        rec["dparam"], rec["dparam_where"] = max_delta(final, ref[2])
    rec["analytic"] = engine.analytic()
    rec["max_inflight"] = getattr(engine.model, "max_inflight", 0)
    (out / f"rank{rank}.json").write_text(json.dumps(rec, indent=1))
    return rec


def main() -> None:
    plan, out = plan_from_argv()
    torch.set_num_threads(1)
    backend = plan.launch.get("dist_backend", "gloo")
    dist.init_process_group(backend, timeout=timedelta(seconds=float(plan.launch.get("timeout_s", 120))))
    if backend == "nccl":  # CUDA: every factory call below lands on this rank's GPU (untested here: no GPU)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.set_default_device(f"cuda:{torch.cuda.current_device()}")
    try:
        run(plan, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
