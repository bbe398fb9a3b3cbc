"""Which engine runs a cell: one table from (backend, strategy) to the class that runs it.

The launcher reads it to start the right processes, the rank loop (worker.py) and the JAX entry
point (jax/__main__.py) to build the engine; nothing dispatches on strategy strings elsewhere.
Nothing here imports torch or jax: targets are named "module:Class" and loaded only inside the
process that runs them (a torch rank never imports jax; a JAX process imports torch only for a
cross-backend comparison; the Snakemake job that launches a CPU cell imports neither).

Two kinds of engine, by how a cell's processes start:
  torchrun  one process per rank: `Engine(plan, dtype)` is a RankEngine, driven by worker.run
  jax       one process holding all N devices: `Engine(plan)` is a DeviceEngine, run(out) is the cell
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, ContextManager, Protocol

from steps.sharding.plan import BACKENDS, STRATEGY_AXES, PlanError

TORCHRUN, JAX = "torchrun", "jax"


class RankEngine(Protocol):
    """One rank of a torch cell (scratch/engine.py, native/engine.py)."""

    model: Any  # the torch.nn.Module whose trainable parameters the optimizer steps

    def batch(self, step: int, dtype) -> Any:
        """This rank's slice of step `step`'s global batch."""

    def train_step(self, batch) -> Any:
        """Forward and backward (gradients ready for opt.step()); returns this rank's loss."""

    def full_state(self, kind: str) -> dict:
        """'param' or 'grad': full tensors under the single-device names (parity check only)."""

    def reference(self, dtype=None) -> tuple:
        """The single-device run (reference.py): per-step losses and gradients, final parameters;
        in `dtype` if given (float64: how far an fp32 cell's own reference strays, parity.py)."""

    def analytic(self) -> dict:
        """What the plan should cost (analytic.py): state_bytes, comm_bytes, params."""

    def comm_mode(self, counter, world: int) -> ContextManager:
        """Context that counts the collectives the engine's own code does not count."""


class DeviceEngine(Protocol):
    """A JAX cell: one process, every device of the mesh (jax/engine.py, jax/lessons.py)."""

    def run(self, out: Path) -> dict:
        """Run the cell, write its text artifacts to `out`, return rank 0's record."""


@dataclass(frozen=True)
class Entry:
    backend: str
    strategy: str
    process: str  # TORCHRUN | JAX
    target: str  # "package.module:Class"

    @property
    def module(self) -> str:
        """The engine's module (what a rank imports; launch.py preloads it for forked ranks)."""
        return self.target.partition(":")[0]

    def load(self):
        return getattr(import_module(self.module), self.target.partition(":")[2])


ENGINES: dict[tuple[str, str], Entry] = {}
PROCESS: dict[str, str] = {}  # backend -> how its processes start


def register(backend: str, process: str, target: str, strategies) -> None:
    PROCESS[backend] = process
    for s in strategies:
        ENGINES[(backend, s)] = Entry(backend, s, process, target)


_JAX_STRATEGIES = ("single", "dp", "fsdp", "tp", "dp_tp", "fsdp_tp", "dp_fsdp_tp")  # pp: no JAX pipeline here
register(
    "torch_scratch",
    TORCHRUN,
    "steps.sharding.scratch.engine:ScratchEngine",
    ("dp", "fsdp", "tp", "pp", "dp_tp", "zero1", "zero2"),
)
register(
    "torch_native",
    TORCHRUN,
    "steps.sharding.native.engine:NativeEngine",
    ("dp", "fsdp", "tp", "dp_tp", "fsdp_tp", "dp_fsdp_tp"),
)
register("torch_native", TORCHRUN, "steps.sharding.native.engine:PipelineEngine", ("pp",))
# PP × DP, PP × TP, PP × FSDP: the stage split first, then each stage parallelized (native/pp_mesh.py)
register("torch_native", TORCHRUN, "steps.sharding.native.pp_mesh:PipelineMeshEngine", ("pp_dp", "pp_tp", "pp_fsdp"))
register("torch_scratch", TORCHRUN, "steps.sharding.scratch.ep:ScratchEPEngine", ("ep",))
register("torch_native", TORCHRUN, "steps.sharding.native.ep:NativeEPEngine", ("ep", "fsdp_ep"))
register("jax_jit", JAX, "steps.sharding.jax.engine:JitEngine", _JAX_STRATEGIES)
register("jax_shard_map", JAX, "steps.sharding.jax.engine:ShardMapEngine", _JAX_STRATEGIES + ("ep",))
register("jax_lessons", JAX, "steps.sharding.jax.lessons:Lessons", tuple(STRATEGY_AXES))  # strategy unused


def process(backend: str) -> str:
    """TORCHRUN or JAX: how a backend's cells start (whatever the strategy)."""
    if backend not in PROCESS:
        raise PlanError(f"sharding.backend {backend!r} unknown; use one of {BACKENDS}")
    return PROCESS[backend]


def entry(backend: str, strategy: str) -> Entry:
    """The engine of (backend, strategy), or a PlanError naming the backends that run the strategy."""
    process(backend)
    if (backend, strategy) in ENGINES:
        return ENGINES[(backend, strategy)]
    runs = [s for b, s in ENGINES if b == backend]
    elsewhere = [b for b, s in ENGINES if s == strategy and b != "jax_lessons"]
    fix = f"use backend {' or '.join(elsewhere)}" if elsewhere else "no backend runs it"
    raise PlanError(
        f"sharding: backend {backend} has no engine for strategy {strategy!r} (it runs {', '.join(runs)}); {fix}"
    )


def load(plan):
    """The engine class of a plan (imports its module: torch or jax)."""
    return entry(plan.backend, plan.strategy).load()
