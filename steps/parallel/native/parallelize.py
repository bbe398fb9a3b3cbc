"""parallelize_gpt: the techniques applied to our GPT in torchtitan's order, one apply_* each.

  1. apply_tp    DTensor TP per block: q/k/v/c_fc ColwiseParallel, o_proj/c_proj RowwiseParallel
                 (+ SequenceParallel on the norms when plan.sequence_parallel)
  2. apply_fsdp  FSDP2 `fully_shard` per block, then the root; on a 2-D (replicate, shard) data
                 mesh this is HSDP (dp_fsdp_tp: mesh (dp, fsdp, tp), HSDP over (dp, fsdp) × TP)
     or apply_ddp  DistributedDataParallel, for a data axis that only replicates and no TP
                 (DDP does not compose with DTensor TP: dp×tp replicates with HSDP instead,
                 through a shard axis of size 1, torchtitan's dp_replicate; see gpt_mesh_shape)
Activation checkpointing and compile (torchtitan's steps between TP and FSDP) are not applied here.
"""

from __future__ import annotations

from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from steps.parallel.plan import Plan


def gpt_mesh_shape(plan: Plan) -> dict[str, int]:
    """The device mesh parallelize_gpt reads: the plan's, except dp×tp, which replicates with HSDP
    over (dp, shard=1): a reduce-scatter over one rank is free, the all-reduce is DP's 2Ψ."""
    if "dp" in plan.mesh and "tp" in plan.mesh and "fsdp" not in plan.mesh:
        return {"dp": plan.axis("dp"), "shard": 1, "tp": plan.axis("tp")}
    return dict(plan.mesh)


def tp_plan(sequence_parallel: bool) -> dict:
    out = Shard(1) if sequence_parallel else Replicate()
    p = {f"attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
    p.update(
        {
            "attn.o_proj": RowwiseParallel(output_layouts=out),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(output_layouts=out),
        }
    )
    if sequence_parallel:  # norms and residual on T/tp rows; all-gather before attn/mlp, reduce-scatter after
        p.update(
            {
                "ln_1": SequenceParallel(use_local_output=True),
                "ln_2": SequenceParallel(use_local_output=True),
                "attn": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
                ),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            }
        )
    else:  # one DTensor input for q, k and v: their partial input grads are summed, then all-reduced once
        p["attn"] = PrepareModuleInput(
            input_layouts=(Replicate(), None, None), desired_input_layouts=(Replicate(), None, None)
        )
    return p


def apply_tp(model, tp_mesh, sequence_parallel: bool) -> None:
    for block in model.transformer.h:
        plan = tp_plan(sequence_parallel)
        if hasattr(block.mlp, "c_fc2"):  # SwiGLU's gate, by columns like c_fc (up), one DTensor input for both
            plan["mlp.c_fc2"] = ColwiseParallel()
            plan.setdefault(
                "mlp", PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),))
            )
        parallelize_module(block, tp_mesh, plan)
    if sequence_parallel:  # enter the sequence-sharded region at the first block, leave it at ln_f
        parallelize_module(
            model.transformer.h[0],
            tp_mesh,
            PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True),
        )
        parallelize_module(
            model.transformer.ln_f,
            tp_mesh,
            PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True),
        )


def apply_fsdp(model, dp_mesh) -> None:
    """One FSDP2 group per block, then the root (embeddings, ln_f, the tied head)."""
    for block in model.transformer.h:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def apply_ddp(model, dp_mesh):
    return DistributedDataParallel(model, process_group=dp_mesh.get_group())


def parallelize_gpt(model, mesh, plan: Plan):
    """TP on the mesh's tp axis, then FSDP2 over fsdp (or HSDP over dp×shard), else DDP over dp.
    Returns the model to train (DDP wraps it; the others change it in place). Under FSDP2 pass a
    meta-device model and materialise it afterwards (see NativeEngine)."""
    axes = mesh.mesh_dim_names
    if "tp" in axes:
        apply_tp(model, mesh["tp"], plan.sequence_parallel)
    if "dp" in axes and "fsdp" in axes:  # HSDP: shard over fsdp, replicate over dp
        apply_fsdp(model, mesh["dp", "fsdp"])
    elif "fsdp" in axes:
        apply_fsdp(model, mesh["fsdp"])
    elif "shard" in axes:
        apply_fsdp(model, mesh["dp", "shard"])
    elif "dp" in axes:
        model = apply_ddp(model, mesh["dp"])
    return model


def shards_parameters(mesh) -> bool:
    """Whether parallelize_gpt applies FSDP2 on this mesh (so the model should start on meta)."""
    return bool({"fsdp", "shard"} & set(mesh.mesh_dim_names))
