"""A training plan at scale: the mesh (pp × dp × fsdp × ep × tp, pp outermost, tp innermost as in
torchtitan; ep, expert parallelism, is a data axis for the dense parameters, torchtitan's EP
inside dp_shard: they are FSDP-sharded over fsdp × ep, the experts over ep and then fsdp), the
ZeRO stage of the data axis, sequence parallelism, activation checkpointing and the batch.
Checked on construction; every error names the config key and the fix. The mesh vocabulary (AXES,
world, data axes, their checks) and PlanError are the sharding cells' own (steps/sharding/plan.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from steps.sharding.plan import AXES, MeshPlan, PlanError

Ac = Literal["none", "selective", "full"]
AC = get_args(Ac)


@dataclass(frozen=True)
class ScalePlan(MeshPlan):
    mesh: dict = field(default_factory=lambda: {"fsdp": 8})
    zero: int = -1  # -1: 3 when the mesh has fsdp > 1, else 0; 1 and 2 shard a dp axis
    sp: bool = False  # sequence parallel (Megatron's: every activation / tp)
    ac: Ac = "none"  # none | selective (torchtitan's op-level SAC) | full
    local_batch: int = 1  # sequences per data-parallel rank per step
    seq: int = 2048
    microbatches: int = 1  # pp only: m
    interleave: int = 1  # pp only: v virtual stages per rank

    def __post_init__(self):
        self.check()

    @classmethod
    def from_params(cls, p: dict) -> "ScalePlan":
        return cls(**{k: v for k, v in p.items() if k in cls.__dataclass_fields__})

    @property
    def shard(self) -> int:
        """Ranks ZeRO-3 shards the (dense) parameters over: fsdp, × ep with expert parallelism."""
        return self.axis("fsdp") * self.axis("ep")

    @property
    def zero_stage(self) -> int:
        if self.zero >= 0:
            return self.zero
        return 3 if self.shard > 1 else 0

    def group_size(self, axis: str) -> int:
        """Ranks of a comm key's group: a mesh axis, or `dp_shard` (fsdp × ep, the dense FSDP group under EP)."""
        return self.shard if axis == "dp_shard" else self.axis(axis)

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.data_size

    @property
    def micro_batch(self) -> int:
        return self.local_batch // self.microbatches

    @property
    def mesh_str(self) -> str:
        return "×".join(f"{a}{self.axis(a)}" for a in AXES if self.axis(a) > 1) or "single"

    @property
    def name(self) -> str:
        z = self.zero_stage
        extra = [f"zero{z}"] if z in (1, 2) else []
        extra += ["sp"] if self.sp else []
        extra += [f"ac-{self.ac}"] if self.ac != "none" else []
        return " ".join([self.mesh_str, *extra])

    def check(self) -> None:
        self.check_mesh("scale plan mesh")
        if self.ac not in AC:
            raise PlanError(f"scale plan ac {self.ac!r}: use one of {AC}")
        if self.zero not in (-1, 0, 1, 2, 3):
            raise PlanError(f"scale plan zero {self.zero}: use 0..3 (or -1 = from the mesh)")
        if self.axis("fsdp") > 1 and self.zero not in (-1, 3):
            raise PlanError("scale plan: an fsdp axis is ZeRO-3; drop `zero`, or use a dp axis for ZeRO-1/2")
        if self.axis("ep") > 1 and (self.zero not in (-1, 3) or self.axis("tp") > 1 or self.axis("pp") > 1):
            raise PlanError("scale plan: ep is simulated and modelled with fsdp and dp only (ZeRO-3; no tp, pp, zero)")
        if self.local_batch % self.microbatches:
            raise PlanError(
                f"scale plan local_batch {self.local_batch} must divide by microbatches {self.microbatches}"
            )
