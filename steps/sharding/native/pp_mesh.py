"""Pipeline parallelism combined with DP, TP or FSDP2 on our GPT (strategies pp_dp, pp_tp, pp_fsdp;
mesh {pp: S, dp | tp | fsdp: N}, pp the outer axis: a stage's N ranks are neighbours), in
torchtitan's order: PP splits the model first (pipeline.GPTStage: n_layer/S blocks, the embeddings
on the first stage, final norm and untied head on the last), then each stage is

  pp_tp    TP'd over its tp group (apply_tp's per-block plan: q/k/v/c_fc by columns, o_proj/c_proj
           by rows; embeddings, norms and head replicated, as in the tp cell)
  pp_fsdp  FSDP2-sharded over its fsdp group, one group per block and the stage as root, none
           resharded after forward (torchtitan's choice under PP: otherwise every microbatch's
           forward would gather the block again): one all-gather and one reduce-scatter a step
  pp_dp    replicated over its dp group with FSDP2 on a (dp, shard=1) mesh, as torchtitan's
           dp_replicate and our dp×tp cell do: the reduce-scatter over one rank is free, the
           all-reduce over dp is DP's 2Ψ, once a step (pipelining defers the non-last microbatches'
           gradient sync). DDP, which torch.distributed.pipelining also special-cases, fails its
           first step on torch 2.13 (docs/sharding.md has the error)

then handed to torch.distributed.pipelining (PipelineStage over the pp group, GPipe or 1F1B).
Each data rank (dp or fsdp index) pushes its own B/N rows through its own pipeline in M
microbatches; pp_tp's two ranks of a stage push the same rows.

Parity (worker.py): every rank gathers its pipeline's full state from its pp group (each tensor
full_tensor'd over tp or fsdp first), so each data replica's view of the whole model is checked
against one device and against the other replicas.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage

from steps.analytic import costs
from steps.models.gpt import causal_lm_loss
from steps.sharding import comm
from steps.sharding.gpt_init import full_model, param_shapes
from steps.sharding.native.engine import GPTEngine, _device_type, full_tensor
from steps.sharding.native.parallelize import apply_tp
from steps.sharding.native.pipeline import SCHEDULES, GPTStage, run_schedule
from steps.sharding.plan import Plan


def parallelize_stage(stage: GPTStage, mesh, plan: Plan):
    """TP, then FSDP2 (sharding over fsdp, or replicating over dp), on one pipeline stage, in place
    (torchtitan's order after the PP split). Returns the module to hand to PipelineStage."""
    axes = mesh.mesh_dim_names
    if "tp" in axes:  # without sequence parallel (Plan.check): a stage's boundary carries whole activations
        apply_tp(SimpleNamespace(transformer=SimpleNamespace(h=stage.h)), mesh["tp"])  # its blocks only
    data = mesh["fsdp"] if "fsdp" in axes else mesh["dp", "shard"] if "dp" in axes else None
    if data is not None:
        for block in stage.h:
            fully_shard(block, mesh=data, reshard_after_forward=False)
        fully_shard(stage, mesh=data, reshard_after_forward=False)
    return stage


def stage_mesh_shape(plan: Plan) -> dict[str, int]:
    """The plan's mesh, with pp_dp's replicate axis given a shard axis of one (HSDP replicating)."""
    return {**plan.mesh, "shard": 1} if "dp" in plan.mesh else dict(plan.mesh)


def stage_io(plan: Plan, stage: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A microbatch's (input, output) on `stage`, on the meta device: ids (mb, T) into the first
    stage, activations (mb, T, C) between stages, logits (mb, T, V) out of the last. Given, the
    stages skip pipelining's first-step shape inference, whose extra forward would run (and the
    counter charge) a TP cell's all-reduces and an FSDP cell's all-gathers once more."""
    g = plan.gpt
    mb = plan.batch_size // plan.data_size // plan.microbatches
    # activations and logits carry gradients (a stage receives its output's, sends back its input's)
    act = torch.empty(mb, g["block_size"], g["n_embd"], dtype=dtype, device="meta", requires_grad=True)
    ids = torch.empty(mb, g["block_size"], dtype=torch.long, device="meta")
    logits = torch.empty(mb, g["block_size"], g["vocab_size"], dtype=dtype, device="meta", requires_grad=True)
    return (ids if stage == 0 else act), (logits if stage == plan.axis("pp") - 1 else act)


class PipelineMeshEngine(GPTEngine):
    """strategies pp_dp, pp_tp, pp_fsdp, backend torch_native."""

    def __init__(self, plan: Plan, dtype):
        super().__init__(plan, dtype)
        shape = stage_mesh_shape(plan)
        self.mesh = init_device_mesh(_device_type(), tuple(shape.values()), mesh_dim_names=tuple(shape))
        self.split_batch_over(self.mesh)  # dp or fsdp: the rows of this rank's pipeline
        self.pp_group = self.mesh["pp"].get_group()
        self.stage_index, self.stages = self.mesh.get_local_rank("pp"), plan.axis("pp")
        ref = full_model(plan, dtype)  # same seed on every rank: every stage starts from one device's weights
        self.shapes = param_shapes(ref)
        per = plan.gpt["n_layer"] // self.stages
        i, last = self.stage_index, self.stages - 1
        self.stage = GPTStage(ref, range(i * per, (i + 1) * per), first=i == 0, last=i == last)
        name_of = {id(p): k for k, p in ref.named_parameters()}
        self.ref_names = {k: name_of[id(p)] for k, p in self.stage.named_parameters()}  # before TP/FSDP swap them
        self.model = parallelize_stage(self.stage, self.mesh, plan)
        pstage = PipelineStage(
            self.model, i, self.stages, torch.get_default_device(), *stage_io(plan, i, dtype), group=self.pp_group
        )
        self.schedule = SCHEDULES[plan.schedule](pstage, n_microbatches=plan.microbatches, loss_fn=causal_lm_loss)

    def train_step(self, ids) -> torch.Tensor:
        loss = run_schedule(self.schedule, self.stage_index, self.stages, ids, next(self.stage.parameters()).dtype)
        dist.broadcast(loss, group=self.pp_group, group_src=self.stages - 1)  # reporting only: its rows' loss
        return loss

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        """This rank's pipeline's tensors under the single-device names, each stage's gathered over
        tp/fsdp (full_tensor) and then over the pp group (comm.gather_state)."""
        mine = {
            self.ref_names[k]: full_tensor(p if kind == "param" else p.grad) for k, p in self.stage.named_parameters()
        }
        return comm.gather_state(mine, group=self.pp_group)

    def analytic(self) -> dict:
        return costs.gpt_pipeline_costs(self.plan, self.shapes, self.stage_index)
