"""The plan vocabulary: the mesh axes every plan names (AXES), the one PlanError, MeshPlan (what
any plan's mesh says: axis sizes, world size, data axes, checks), and the descriptive plan of one
sharding cell (the AXLearn lesson): mesh, strategy, schedule, model. The scale stage's plan is the
same MeshPlan with its own knobs (steps/scale/scale_plan.py: ZeRO stage, SP, AC, batch).

Plan is also the sharding section as a dataclass (defaults: workflow/schemas/sharding.schema.yaml;
Plan's own are for plans written in code, the tests'): the stage builds it from its section, each
rank from the JSON the launcher gives it (to_dict). Both backends read the cell's Plan; torch
applies it imperatively (torchtitan style: native/parallelize.py, scratch/), JAX hands it to the
compiler as shardings (jax/). Which engine runs a (backend, strategy) is engines.py's table.
Nothing here imports torch or jax at import time (the launching job and the JAX process read it too).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, get_args

from steps.config.typed import typed
from steps.sharding.plan_sections import Fault, Launch, Mlp

AXES = ("pp", "dp", "fsdp", "ep", "tp")  # outer -> inner, torchtitan's order: tp on neighbouring GPUs
DATA_AXES = ("dp", "fsdp", "ep")  # the axes that split the batch (ep: for every parameter but the experts)

# strategy -> the mesh axes it needs, in mesh order (outer axis first)
STRATEGY_AXES = {
    "single": (),
    "dp": ("dp",),
    "fsdp": ("fsdp",),
    "tp": ("tp",),
    "pp": ("pp",),
    "dp_tp": ("dp", "tp"),
    "fsdp_tp": ("fsdp", "tp"),
    "dp_fsdp_tp": ("dp", "fsdp", "tp"),  # HSDP (replicate over dp, shard over fsdp) x TP
    "ep": ("ep",),  # expert parallelism: the MoE GPT's experts sharded, the batch split (expert_parallel.py)
    "fsdp_ep": ("fsdp", "ep"),  # EP inside FSDP: dense sharded over fsdp·ep, experts over ep then fsdp
    # PP combined (native/pp_mesh.py): the GPT cut into stages first, then each stage TP, FSDP2 or DDP
    "pp_dp": ("pp", "dp"),
    "pp_tp": ("pp", "tp"),
    "pp_fsdp": ("pp", "fsdp"),
    "zero1": ("dp",),  # ZeRO-1: DP replicas, the optimizer state sharded over dp (scratch/zero1.py)
    "zero2": ("dp",),  # ZeRO-2: the gradients too (scratch/zero2.py); ZeRO-3 is fsdp
}
Strategy = Literal[tuple(STRATEGY_AXES)]  # the names above (get_args(Strategy) lists them)
PRETTY = {s: s.replace("_", "×") for s in STRATEGY_AXES if "_" in s} | {"zero1": "ZeRO-1", "zero2": "ZeRO-2"}
Backend = Literal["torch_scratch", "torch_native", "jax_jit", "jax_shard_map", "jax_lessons"]
BACKENDS = get_args(Backend)


class PlanError(ValueError):
    """A plan that cannot run as written (names the key and the fix)."""


class MeshPlan:
    """What every plan's `mesh` ({axis: size}, axes from AXES) says. A mixin: each plan declares
    its own `mesh` field (and keeps its field order)."""

    mesh: dict

    def axis(self, name: str) -> int:
        return int(self.mesh.get(name, 1))

    @property
    def world(self) -> int:
        return math.prod(self.axis(a) for a in self.mesh)

    @property
    def data_axes(self) -> tuple[str, ...]:
        """Every axis the batch is split over: dp and fsdp together under HSDP (dp_fsdp_tp)."""
        return tuple(a for a in DATA_AXES if a in self.mesh)

    @property
    def data_size(self) -> int:
        """Ranks that see different rows of the batch: the product of the data axes."""
        return math.prod(self.axis(a) for a in self.data_axes)

    def check_mesh(self, key: str) -> None:
        """Known axes, sizes >= 1; `key` is the config key the errors name (e.g. sharding.mesh)."""
        bad = set(self.mesh) - set(AXES)
        if bad:
            raise PlanError(f"{key} axes {sorted(bad)} unknown; use {list(AXES)}")
        if any(int(v) < 1 for v in self.mesh.values()):
            raise PlanError(f"{key} sizes must be >= 1, got {self.mesh}")


JOB_ONLY = {"job": True}  # field metadata: the Snakemake job's knob, not the ranks' (not in to_dict)


@dataclass(frozen=True, kw_only=True)
class Plan(MeshPlan):
    backend: Backend = "torch_scratch"
    strategy: Strategy = "dp"
    mesh: dict = field(default_factory=lambda: {"dp": 2})
    schedule: Literal["gpipe", "1f1b"] = "gpipe"  # pp only
    microbatches: int = 4  # pp only
    model: Literal["mlp", "gpt"] = "mlp"
    dtype: Literal["float32", "float64"] = "float32"
    steps: int = 3  # K optimizer steps compared against one device
    batch_size: int = 16  # global batch (rows for the MLP, sequences for the GPT)
    lr: float = 1e-3
    optimizer: Literal["adam", "sgd"] = "adam"  # sgd: momentum 0.9; see parity note in optimizer_for()
    seed: int = 1234
    cross_backend: bool = True  # jax cells: also run the torch single-device step; it joins the verdict (parity.KINDS)
    sequence_parallel: bool = False  # native TP on the GPT: shard LayerNorm/dropout activations on sequence
    mlp: Mlp = Mlp()
    # GPTConfig's fields by name (the schema's: vocab_size, block_size, n_layer, n_head, n_embd, moe;
    # code may add others): a dict, not a GPTConfig, so that the plan stays torch-free; the ranks
    # build the model's GPTConfig from it (gpt_init.gpt_config)
    gpt: dict = field(
        default_factory=lambda: {"vocab_size": 128, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 32}
    )
    launch: Launch = Launch()
    fault: Fault = Fault()
    job_threads: int = field(default=1, metadata=JOB_ONLY)  # cores Snakemake reserves for the cell's job

    @classmethod
    def from_params(cls, params: dict) -> "Plan":
        """The plan of a sharding section (the job's params, or the JSON a rank is given): keys that
        are no field are left out, nested dicts become their dataclasses (absent keys: defaults)."""
        known = {k: v for k, v in params.items() if k in cls.__dataclass_fields__}
        # a job's cfg is JSON with sorted keys, so a YAML mesh's order never reaches here: the
        # strategy fixes it (outer axis first)
        want, mesh = STRATEGY_AXES.get(known.get("strategy", cls.strategy), ()), known.get("mesh")
        if isinstance(mesh, dict) and set(mesh) == set(want):
            known["mesh"] = {a: mesh[a] for a in want}
        plan = typed(cls, known)
        plan.check()
        return plan

    of = from_params  # every section dataclass's builder is `of` (tests/test_config_knobs.py)

    def to_dict(self) -> dict:
        """What the ranks are given (--plan JSON) and the stage logs as its `plan` tag."""
        d = asdict(self)
        return {f.name: d[f.name] for f in fields(self) if not f.metadata.get("job")}

    # ---- derived facts (world, axis, data_axes, data_size: MeshPlan) ----------------------
    @property
    def data_axis(self) -> str | None:
        """The axis the batch is split on (dp, fsdp or ep), if any."""
        return next(iter(self.data_axes), None)

    @property
    def pipelined(self) -> bool:
        """A pipeline plan: pp alone, or pp combined with dp, tp or fsdp (the model is cut into stages)."""
        return "pp" in self.mesh and self.backend != "jax_lessons"

    @property
    def pretty(self) -> str:
        return PRETTY.get(self.strategy, self.strategy)

    @property
    def mesh_str(self) -> str:
        return "×".join(f"{k}{v}" for k, v in self.mesh.items()) or "1"

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise PlanError(f"sharding.backend {self.backend!r} unknown; use one of {BACKENDS}")
        if self.strategy not in STRATEGY_AXES:
            raise PlanError(f"sharding.strategy {self.strategy!r} unknown; use one of {list(STRATEGY_AXES)}")
        want = STRATEGY_AXES[self.strategy]
        if self.backend == "jax_lessons":
            return
        if tuple(self.mesh) != want:
            raise PlanError(
                f"sharding: strategy {self.strategy} needs mesh axes {list(want)}, "
                f"got {list(self.mesh)}; fix: mesh: {{{', '.join(f'{a}: 2' for a in want)}}}"
            )
        self.check_mesh("sharding.mesh")
        dp = self.data_size
        if self.batch_size % dp:
            raise PlanError(f"sharding.batch_size {self.batch_size} must divide by the data axes' size {dp}")
        if self.pipelined:
            if self.schedule not in ("gpipe", "1f1b"):
                raise PlanError(f"sharding.schedule {self.schedule!r}: use gpipe or 1f1b")
            if (self.batch_size // dp) % self.microbatches:  # each data rank's rows go through the pipeline
                raise PlanError(
                    f"sharding.batch_size {self.batch_size} / data axes {dp} must divide by microbatches "
                    f"{self.microbatches}"
                )
        if self.pipelined and self.sequence_parallel:
            raise PlanError("sharding.sequence_parallel is not wired across pipeline stages; fix: false under pp")
        layers = self.mlp.layers if self.model == "mlp" else self.gpt["n_layer"]
        if self.pipelined and layers % self.axis("pp"):
            raise PlanError(f"sharding: {layers} layers do not split evenly over pp={self.axis('pp')} stages")
        tp = self.axis("tp")
        if self.model == "mlp" and self.mlp.hidden % tp:
            raise PlanError(f"sharding.mlp.hidden {self.mlp.hidden} must divide by tp={tp}")
        if self.model == "gpt" and (self.gpt["n_head"] % tp or self.gpt["n_embd"] % self.gpt["n_head"]):
            raise PlanError(f"sharding.gpt.n_head {self.gpt['n_head']} must divide by tp={tp}")
        if "ep" in self.mesh:
            self._check_ep()
        if self.optimizer not in ("adam", "sgd"):
            raise PlanError(f"sharding.optimizer {self.optimizer!r}: use adam or sgd")
        if self.dtype not in ("float32", "float64"):
            raise PlanError(f"sharding.dtype {self.dtype!r}: use float32 or float64")

    def _check_ep(self) -> None:
        moe = self.gpt.get("moe") or {}
        if self.model != "gpt" or not {"experts", "top_k"} <= set(moe):
            raise PlanError("sharding: strategy ep needs model: gpt with gpt.moe: {experts: E, top_k: k}")
        experts, ep = moe["experts"], self.axis("ep")
        if experts % ep:
            raise PlanError(f"sharding.gpt.moe.experts {experts} must divide by ep={ep} (each rank holds E/ep)")
        if moe.get("capacity_factor") is not None:
            raise PlanError(
                "sharding: ep with gpt.moe.capacity_factor would drop by each rank's share of the batch, "
                "not the global batch's as one device does; fix: capacity_factor: null"
            )

    @property
    def state_tensors(self) -> int:
        """Tensors of the local parameter size a rank keeps: param, grad + Adam's 2 moments or SGD's momentum."""
        return 4 if self.optimizer == "adam" else 3

    def optimizer_for(self, params):
        """Adam's update lr·m/(sqrt(v)+eps) turns a rounding-level gradient difference on a
        near-zero gradient into a parameter difference of up to lr·Δg/eps (seen: 5e-7 grads ->
        1e-5 params on the GPT with TP in fp32); SGD's update is lr-Lipschitz in the gradient.
        foreach=False: the foreach kernels reject a mix of Tensor and DTensor parameters."""
        import torch  # only where an optimizer is built: the launching job and JAX cells stay torch-free

        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr, foreach=False)
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9, foreach=False)

    @property
    def bytes_per_elem(self) -> int:
        return 8 if self.dtype == "float64" else 4

    @property
    def tolerance(self) -> float:
        """The parity target: 1e-5 in fp32 (a floor: a torch cell widens it per tensor to twice one fp32
        device's own error against the fp64 run, parity.rounding_tolerances), 1e-12 in fp64."""
        return 1e-12 if self.dtype == "float64" else 1e-5

    def pipeline_bubble(self) -> float:
        """Idle fraction of a GPipe/1F1B step, (S-1)/(M+S-1): 1F1B saves activation memory, not bubble."""
        if not self.pipelined:
            return 0.0
        s, m = self.axis("pp"), self.microbatches
        return (s - 1) / (m + s - 1)
