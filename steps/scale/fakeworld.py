"""One rank of a W-rank job, in this process: torch's fake process group (collectives return at
once, nothing is sent), a DeviceMesh (dp, fsdp, ep, tp) over it, the real model under a FakeTensorMode
(recipe.py) parallelized by the sharding stage's path (steps/sharding/native/parallelize.py), one
training step (forward, loss, backward, AdamW step). Read from it, exactly:

  state      local shard bytes (DTensor.to_local) of the parameters (fp32), their gradients (fp32,
             FSDP2 reduces in fp32) and AdamW's two moments (fp32) after the step
  gathered   bytes of the parameter storages the forward ran on (FSDP2's unsharded bf16 copies:
             with reshard_after_forward=False, ZeRO-2-like, all of them are held until backward)
  saved      bytes autograd saved for backward: distinct storages through saved_tensors_hooks (perf's
             meter, keyed by storage identity since fake tensors have no addresses), less the
             parameters' storages (the all-gathered bf16 weights the matmuls keep, FSDP2 frees them)
  comm       every collective through steps/sharding/comm.py's dispatch-mode counter, attributed
             to its mesh axis (ring-equivalent bytes sent per rank, steps/analytic/comm.py's RING factors);
             with expert parallelism the dense FSDP group fsdp × ep is `dp_shard` (shard_axis)

Depth: a transformer's layers are identical, so every quantity is a + L·b. A step of 1 layer and
one of 2 layers at the full width, sequence, batch and world size give a and b exactly; the full
depth follows (tests/test_scale.py checks it against a direct full-depth step). The full-depth
model is also built and sharded, and its parameter bytes read directly (`params_direct`), up to a
world of 256 (versus.DIRECT_MAX_WORLD: beyond it the fake chunking costs more than the step).
"""

from __future__ import annotations

import math
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from steps.analytic.comm import shard_axis
from steps.models.shapes import Shape
from steps.scale import recipe as R
from steps.sharding.comm import CommCounter, NativeCommMode
from steps.sharding.native import parallelize as P
from steps.sharding.plan import AXES as PLAN_AXES

AXES = tuple(a for a in PLAN_AXES if a != "pp")  # the simulated mesh: pipeline stages are analytic only


@dataclass
class Step:
    params: float = 0.0
    grads: float = 0.0
    optim: float = 0.0
    saved: float = 0.0
    gathered: float = 0.0  # parameter storages the forward used (FSDP2's unsharded bf16 copies)
    comm: Counter = field(default_factory=Counter)  # "<axis>/<op>" -> bytes sent per rank
    saved_per_layer: float = 0.0  # one layer's saved bytes (set by `simulate`: 2-layer step - 1-layer step)

    def combine(self, other: "Step", a: float, b: float) -> "Step":
        keys = set(self.comm) | set(other.comm)
        return Step(
            *(a * getattr(self, k) + b * getattr(other, k) for k in ("params", "grads", "optim", "saved", "gathered")),
            Counter({k: a * self.comm[k] + b * other.comm[k] for k in keys}),
        )

    @property
    def state(self) -> float:
        return self.params + self.grads + self.optim


def fake_world(world: int) -> None:
    """(Re)start this process as rank 0 of `world` ranks on the fake backend."""
    if dist.is_initialized():
        if dist.get_world_size() == world:
            return
        dist.destroy_process_group()
        _MESHES.clear()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())


def leave_fake_world() -> None:
    """Back to no process group: a test process that simulated must not leave a fake world behind
    for a later test that starts a real one."""
    if dist.is_initialized() and dist.get_backend() == "fake":
        dist.destroy_process_group()
    _MESHES.clear()


@dataclass
class Mesh:
    """The (dp, fsdp, ep, tp) mesh and the sub-meshes the model is parallelized on (sliced here:
    slicing a mesh runs tensor ops that a FakeTensorMode cannot). With ep > 1 the dense parameters'
    data mesh is fsdp × ep flattened (`dp_shard`, torchtitan's name)."""

    full: object
    tp: object
    data: object
    groups: dict  # process-group name -> axis
    ep: object = None
    fsdp: object = None

    @property
    def size(self) -> int:
        return self.full.size()


_MESHES: dict[tuple, Mesh] = {}


def mesh_for(sizes: dict) -> Mesh:
    """The mesh of these axis sizes, one per shape and process: DTensor's sharding cache treats
    equal-shaped meshes as one, so a second mesh would see collectives on the first one's groups."""
    dims = tuple(int(sizes.get(a, 1)) for a in AXES)
    fake_world(math.prod(dims))
    if dims not in _MESHES:
        full = init_device_mesh("cpu", dims, mesh_dim_names=AXES)
        groups = {full.get_group(a).group_name: a for a in AXES}
        if dims[AXES.index("ep")] == 1:
            _MESHES[dims] = Mesh(full, full["tp"], full["dp", "fsdp"], groups)
        else:
            if dims[0] > 1:
                raise ValueError("scale: ep is simulated without a dp axis (use fsdp × ep)")
            data = full["fsdp", "ep"]._flatten("dp_shard") if dims[1] > 1 else full["ep"]
            groups[data.get_group().group_name] = shard_axis(dims[1], dims[2])
            _MESHES[dims] = Mesh(full, full["tp"], data, groups, full["ep"], full["fsdp"])
    return _MESHES[dims]


def _local_bytes(t) -> int:
    if t is None:
        return 0
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a wrapper's own storage would be a fake one of its global size)."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _key(t: torch.Tensor):
    return _local(t).untyped_storage()._cdata


class AxisCounter(CommCounter):
    """comm.py's counter, each collective also charged to the mesh axis set before it runs."""

    def reset(self) -> None:
        super().reset()
        self.axis, self.by_axis = "?", Counter()

    def add(self, op: str, nbytes: int, group_size: int, ranks=None) -> None:
        before = self.bytes
        super().add(op, nbytes, group_size, ranks)
        self.by_axis[f"{self.axis}/{op}"] += self.bytes - before


class AxisCommMode(NativeCommMode):
    """comm.py's dispatch-mode counter; the group a collective names gives its mesh axis."""

    def __init__(self, mesh: Mesh):
        self.names = mesh.groups
        super().__init__(AxisCounter(), mesh.size)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"):
            self.counter.axis = self._axis(list(args) + list((kwargs or {}).values()))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _axis(self, args) -> str:
        for a in args:
            name = a if isinstance(a, str) else getattr(a, "group_name", None)
            if type(a).__name__ == "ScriptObject":
                name = dist.ProcessGroup.unbox(a).group_name
            if name in self.names:
                return self.names[name]
        return "?"


@contextmanager
def saved_meter(model):
    """Yields a dict storage -> bytes of what autograd saves, less the parameters' storages
    (recorded as each module runs: the unsharded bf16 copies exist only then)."""
    saved, params = {}, {}

    def note_params(module, _args):
        for p in module.parameters(recurse=False):
            params[_key(p)] = _local(p).untyped_storage().nbytes()

    handles = [m.register_forward_pre_hook(note_params) for m in model.modules()]

    def pack(t):
        saved[_key(t)] = _local(t).untyped_storage().nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield saved, params
    finally:
        for h in handles:
            h.remove()


def one_step(shape: Shape, mesh, layers: int, batch: int, seq: int, recipe: R.Recipe = R.SCALE) -> Step:
    """One training step of `layers` layers at the full width on `mesh` (batch = this rank's)."""
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    model = parallelized(shape, mesh, fake, layers, recipe)
    model.train()
    with fake:
        ids = torch.randint(0, shape.vocab, (batch, seq))
        mode = AxisCommMode(mesh)
        with mode:
            with saved_meter(model) as (saved, params):
                R.loss_of(model, ids, recipe)
        opt = recipe.optimizer_for(list(model.parameters()))
        opt.step()
    ps = list(model.parameters())
    moments = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return Step(
        params=sum(_local_bytes(p) for p in ps),
        grads=sum(_local_bytes(p.grad) for p in ps),
        optim=sum(_local_bytes(v) for v in moments),
        saved=sum(n for k, n in saved.items() if k not in params),
        gathered=sum(params.values()),
        comm=mode.counter.by_axis,
    )


def parallelized(shape: Shape, mesh: Mesh, fake: FakeTensorMode, layers: int | None = None, recipe=R.SCALE):
    """The model built under `fake`, TP over mesh['tp'] (if > 1), FSDP2 over mesh['dp','fsdp'].
    Parallelized outside the mode: the fake tensors keep their mode, while FSDP2's mesh
    bookkeeping (it concatenates the TP and data meshes) needs real tensor ops."""
    with fake:
        model = R.build(shape, layers, recipe)
    if mesh.tp.size() > 1:
        P.apply_tp(model, mesh.tp, recipe.sp)
    if shape.experts:
        from steps.scale import balanced_moe

        balanced_moe.balance(model)
        if mesh.ep is not None:
            P.apply_ep(model, mesh.ep, mesh.data.get_group(), fsdp_mesh=mesh.fsdp, mp_policy=R.policy(recipe))
            balanced_moe.balance(model)
    P.apply_fsdp(model, mesh.data, R.policy(recipe), reshard_after_forward=recipe.reshard)
    return model


def full_depth_params(shape: Shape, mesh) -> int:
    """Parameter bytes of this rank in the full-depth model, read directly (no step)."""
    model = parallelized(shape, mesh, FakeTensorMode(allow_non_fake_inputs=True))
    return sum(_local_bytes(p) for p in model.parameters())


def simulate(shape: Shape, sizes: dict, batch: int, seq: int, recipe: R.Recipe = R.SCALE) -> Step:
    """The full-depth step from a 1-layer and a 2-layer step at full world size (see top)."""
    mesh = mesh_for(sizes)
    one, two = (one_step(shape, mesh, n, batch, seq, recipe) for n in (1, 2))
    per_layer = two.combine(one, 1.0, -1.0)
    full = one.combine(per_layer, 1.0, shape.layers - 1.0)
    full.saved_per_layer = per_layer.saved
    return full
