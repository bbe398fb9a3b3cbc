"""One rank of a torch cell: `torchrun ... -m steps.sharding.worker --plan JSON --out DIR`, or forked
from a preloaded forkserver by `python -m steps.sharding.torchrun` (torchrun.py; launch.forked_ranks).

The rank's loop only: build the plan's engine (engines.py), train K steps, and measure. Rank 0
runs the engine's single-device reference on the same global batches from the same weights and
hands it to every rank; EVERY rank compares its loss, its view of the gradients (every step) and of
the parameters (after K steps) with it (parity.max_delta), and the ranks' views are compared with
each other (parity.replica_spread): a replica that drifts cannot hide behind rank 0.
Each rank writes DIR/rank<r>.json; the parent (launch.py) gathers.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from steps import hardware, lifeline
from steps.sharding import comm, engines, nodes
from steps.sharding.faults import maybe_diverge, maybe_fault, maybe_scale_grads
from steps.sharding.parity import max_delta, over_tolerance, replica_spread, rounding_tolerances, worse
from steps.sharding.plan import Plan
from steps.sharding.plan_cli import plan_from_argv
from steps.sharding.reference import DTYPES

_PR_SET_NAME = 15


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def state_bytes(params, opt, held: dict | None = None) -> dict:
    """Params, grads and optimizer moments this rank holds (DTensor: its local shard). `held`: the
    params and grads the rank keeps when the optimizer's parameters are views into them (ZeRO-1/2:
    a whole replica, of which the optimizer steps this rank's slice; scratch/zero1.py)."""
    moments = [v for p in params for k, v in opt.state[p].items() if k in ("exp_avg", "exp_avg_sq", "momentum_buffer")]
    held = held or {"params": params, "grads": [p.grad for p in params]}
    return {"params": local_bytes(held["params"]), "grads": local_bytes(held["grads"]), "optim": local_bytes(moments)}


def device_sync() -> None:
    """Wait for this rank's GPU before reading the clock: kernels and NCCL collectives run
    asynchronously, so without it a step's time is the time to launch it. No-op on the CPU."""
    if torch.get_default_device().type == "cuda":  # main() sets it under NCCL
        torch.cuda.synchronize()


def check_loss_dtype(loss: torch.Tensor, dtype) -> None:
    """A float64 plan whose loss comes back float32 compares float32 rounding against 1e-12."""
    if loss.dtype != dtype:
        raise RuntimeError(
            f"parity: the engine's loss is {loss.dtype} in a {dtype} plan: the loss is computed below "
            "the plan's precision (a .float() on the logits?), so the loss parity would measure that rounding"
        )


def reference_and_tolerances(engine, plan: Plan) -> tuple:
    """Rank 0's single-device run, handed to every rank, with the per-tensor tolerances of an fp32
    cell (parity.rounding_tolerances: the same run in fp64 says how far fp32 itself strays; None
    in fp64, whose tolerance is the plan's)."""
    if dist.get_rank() != 0:
        return comm.from_rank0(None)
    ref = engine.reference()
    tols = None
    if plan.dtype == "float32":
        tols = rounding_tolerances(ref, engine.reference(torch.float64), plan.tolerance)
    return comm.from_rank0((ref, tols))


def wire_counter() -> Path | None:
    """The sent-bytes counter of the interface gloo uses between hosts (GLOO_SOCKET_IFNAME, which
    nodes.rank_env sets on a multi-node launch), read on each node's local rank 0 only; None
    elsewhere. Inside `ip netns exec` /sys is the namespace's own, so a veth end counts one host."""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    path = Path("/sys/class/net", ifname, "statistics", "tx_bytes")
    return path if ifname and int(os.environ.get("LOCAL_RANK", 0)) == 0 and path.exists() else None


def run(plan: Plan, out: Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[plan.dtype]
    torch.manual_seed(plan.seed)
    engine = engines.load(plan)(plan, dtype)
    ref, tols = reference_and_tolerances(engine, plan)  # ref: (losses, grads, final params)
    tols = tols or {"loss": [plan.tolerance] * plan.steps, "grad": [None] * plan.steps, "param": None}
    named = [(n, p) for n, p in engine.model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    opt = plan.optimizer_for(params)
    counter = comm.COUNTER
    rec = {"rank": rank, "world": world, "losses": [], "step_s": [], "comm_bytes": [], "dgrad": [], "dloss": []}
    over: dict[str, dict] = {}  # per kind, the worst share of its tensor's tolerance (parity.verdict)
    groups: dict[str, float] = {}
    spreads = []  # (max |view_r - view_0| over the ranks, name): gradients every step, then parameters
    # bytes on the wire where a link between hosts is named: every rank joins one more barrier per
    # step (so the node's count ends with every rank's step), a single-host run is left as it was
    across_hosts = bool(os.environ.get("GLOO_SOCKET_IFNAME")) and int(os.environ.get("LOCAL_WORLD_SIZE", world)) < world
    wire = wire_counter() if across_hosts else None
    if wire:
        rec["wire_tx_bytes"] = []
    hardware.reset_peak_rss()
    for step in range(plan.steps):
        maybe_fault(plan, rank, step, out)
        batch = engine.batch(step, dtype)
        dist.barrier()
        device_sync()
        counter.reset()
        tx0 = int(wire.read_text()) if wire else 0
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with engine.comm_mode(counter, world):
            loss = engine.train_step(batch)
        maybe_scale_grads(plan, params, rank, step)
        opt.step()
        device_sync()
        rec["step_s"].append(time.perf_counter() - t0)
        if across_hosts:
            dist.barrier()
        if wire:
            rec["wire_tx_bytes"].append(int(wire.read_text()) - tx0)
        maybe_diverge(plan, named, rank, step)
        rec["comm_bytes"].append(counter.bytes)
        rec["comm_calls"], rec["comm_detail"] = dict(counter.calls), dict(counter.detail)
        for key, sent in counter.groups.items():  # per group of ranks: nodes.per_link's input
            groups[key] = groups.get(key, 0.0) + sent / plan.steps  # mean per step, as dispatch_comm_bytes_step
        check_loss_dtype(loss, dtype)
        loss = loss.detach().clone()
        dist.all_reduce(loss)  # reporting only: the mean of the ranks' losses (equal slices)
        rec["losses"].append(loss.item() / world)
        rec["dloss"].append(abs(rec["losses"][-1] - ref[0][step]))
        dloss, tol = rec["dloss"][-1], tols["loss"][step]
        over["loss"] = worse(over.get("loss"), dloss / tol, dloss, tol, "")
        grads = engine.full_state("grad")
        delta, rec["dgrad_where"] = max_delta(grads, ref[1][step])
        rec["dgrad"].append(delta)
        over["grad"] = worse(over.get("grad"), *over_tolerance(grads, ref[1][step], tols["grad"][step], plan.tolerance))
        spreads.append(replica_spread(comm.all_states(grads)))
    rec["peak_rss_bytes"] = hardware.peak_rss_bytes()
    rec["state_bytes"] = state_bytes(params, opt, engine.model.held() if hasattr(engine.model, "held") else None)
    final = engine.full_state("param")
    rec["dparam"], rec["dparam_where"] = max_delta(final, ref[2])
    over["param"] = worse(None, *over_tolerance(final, ref[2], tols["param"], plan.tolerance))
    rec["over"] = over
    spreads.append(replica_spread(comm.all_states(final)))
    rec["replica_spread"], rec["replica_where"] = max(spreads)
    rec["analytic"] = engine.analytic()
    rec["max_inflight"] = getattr(engine.model, "max_inflight", 0)
    rec["comm_groups"] = groups
    rec["node"], rec["local_world"] = (
        int(os.environ.get("GROUP_RANK", 0)),
        int(os.environ.get("LOCAL_WORLD_SIZE", world)),
    )
    rec["started"] = "forkserver" if multiprocessing.parent_process() else "exec"  # launch.forked_ranks
    # rank 0 writes every rank's record: the launcher of node 0 reads them without a shared filesystem
    recs = [None] * world if rank == 0 else None
    dist.gather_object(rec, recs, dst=0)
    for r in recs or []:
        (out / f"rank{r['rank']}.json").write_text(json.dumps(r, indent=1))
    return rec


def exchange_peers(out: Path) -> None:
    """Multi-node: every node's address on every rank; each node's local rank 0 writes
    out/peers.json, from which a failed launch names the node it cannot reach (nodes.diagnose)."""
    world, local = dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    if local == world:
        return
    me = {"node": int(os.environ.get("N00BGPT_NODE_RANK", 0)), "addr": os.environ.get("N00BGPT_NODE_ADDR", "")}
    everyone = [None] * world
    dist.all_gather_object(everyone, me)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        nodes.write_peers(out / "peers.json", list({p["node"]: p for p in everyone}.values()))


def name_process(rank: str) -> None:
    """`rank<r>` in ps/top (the kernel's comm, PR_SET_NAME): a forked rank's command line is its
    forkserver's, so without it the ranks of a cell would all read `python -c from multiprocessing...`."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, f"rank{rank}".encode()[:15], 0, 0, 0)


def main() -> None:
    lifeline.die_with_owner()  # a rank never outlives the job that launched it
    name_process(os.environ.get("RANK", "?"))
    plan, out = plan_from_argv()
    torch.set_num_threads(1)
    backend = plan.launch.dist_backend
    dist.init_process_group(backend, timeout=timedelta(seconds=float(plan.launch.timeout_s)))
    if backend == "nccl":  # CUDA: every factory call below lands on this rank's GPU (untested here: no GPU)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.set_default_device(f"cuda:{torch.cuda.current_device()}")
    try:
        exchange_peers(out)
        run(plan, out)
    finally:
        dist.destroy_process_group()
    # Done: the rank's JSON is written and the group destroyed. Leave without the interpreter's
    # finalization, where a gloo worker thread's C++ objects can still be torn down and abort the
    # rank after its work is done ("terminate called without an active exception", SIGABRT: seen
    # once in a test run at 582c0ad, rank 0 of a finished 2-rank cell, which failed the launch).
    # A forked rank returns instead: torchrun's agent waits for its function's return value, and
    # multiprocessing ends the child with os._exit after that, without the interpreter's finalization.
    sys.stdout.flush()
    sys.stderr.flush()
    if multiprocessing.parent_process() is None:
        os._exit(0)


if __name__ == "__main__":
    main()
