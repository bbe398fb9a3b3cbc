"""The one parallelize path: torch's production APIs applied in torchtitan's order, one apply_* each.
The sharding stage's native cells (parallelize_gpt, native/ep.py) and the scale simulator (steps/scale/
fakeworld.py, on the fake process group) both call these; what differs between them is a parameter.

  1. apply_tp    DTensor TP per block. Our GPT: q/k/v/c_fc ColwiseParallel, o_proj/c_proj
                 RowwiseParallel (+ SequenceParallel on the norms when sequence_parallel).
                 HF Llama: q/k/v and gate/up ColwiseParallel, o/down RowwiseParallel, the embedding
                 RowwiseParallel, the LM head ColwiseParallel with its logits left vocabulary-sharded
                 for a loss-parallel cross-entropy (torchtitan's plan)
  2. apply_ep    the MoE's experts Shard(0) over the ep mesh (torchtitan's ExpertParallel), each
                 layer's local experts FSDP2 over an fsdp mesh if given
  3. apply_fsdp  FSDP2 `fully_shard` per block, then the root; on a 2-D (replicate, shard) data
                 mesh this is HSDP (dp_fsdp_tp: mesh (dp, fsdp, tp), HSDP over (dp, fsdp) × TP);
                 mp_policy (bf16 compute, fp32 reduction at scale; none in the fp32/fp64 cells) and
                 reshard_after_forward (False: ZeRO-2's one all-gather a step) are parameters
     or apply_ddp  DistributedDataParallel, for a data axis that only replicates and no TP
                 (DDP does not compose with DTensor TP: dp×tp replicates with HSDP instead,
                 through a shard axis of size 1, torchtitan's dp_replicate; see gpt_mesh_shape)
Activation checkpointing and compile (torchtitan's steps between TP and FSDP) are not applied here
(our GPT checkpoints its own blocks: GPTConfig.checkpoint_activations).
"""

from __future__ import annotations

import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from steps.models.moe import Experts, grouped_mlp
from steps.sharding.expert_parallel import Collectives, expert_parallel_moe, moe_layers
from steps.sharding.plan import Plan
from steps.sharding.router_stats import pool_over_data_axes

NO_MIXED_PRECISION = MixedPrecisionPolicy()  # FSDP2's default: compute and reduce in the parameters' dtype


def gpt_mesh_shape(plan: Plan) -> dict[str, int]:
    """The device mesh parallelize_gpt reads: the plan's, except dp×tp, which replicates with HSDP
    over (dp, shard=1): a reduce-scatter over one rank is free, the all-reduce is DP's 2Ψ."""
    if "dp" in plan.mesh and "tp" in plan.mesh and "fsdp" not in plan.mesh:
        return {"dp": plan.axis("dp"), "shard": 1, "tp": plan.axis("tp")}
    return dict(plan.mesh)


def is_hf_llama(model) -> bool:
    return hasattr(model, "model")  # LlamaForCausalLM: model.model.layers; our GPT: model.transformer.h


def blocks(model) -> list:
    """The repeated layers (one TP plan and one FSDP2 group each)."""
    return list(model.model.layers) if is_hf_llama(model) else list(model.transformer.h)


# ---- 1. tensor parallelism ---------------------------------------------------------------------
def gpt_tp_plan(sequence_parallel: bool) -> dict:
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


def llama_tp_plan() -> dict:
    return {
        **{f"self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")},
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
        # one DTensor input for q/k/v (gate/up): their partial input gradients are summed, then
        # all-reduced once (as for our GPT)
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Replicate()},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        ),
        "mlp": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)),
    }


def apply_tp(model, tp_mesh, sequence_parallel: bool = False) -> None:
    """TP over tp_mesh, in place: our GPT (embeddings and the tied head stay replicated) or HF Llama."""
    if is_hf_llama(model):
        _apply_llama_tp(model, tp_mesh, sequence_parallel)
        return
    for block in model.transformer.h:
        plan = gpt_tp_plan(sequence_parallel)
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


def _apply_llama_tp(model, tp_mesh, sequence_parallel: bool) -> None:
    if sequence_parallel:
        raise ValueError("sequence parallel is simulated on our GPT (family gpt2) only; Llama's is analytic")
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, llama_tp_plan())
    parallelize_module(
        model,
        tp_mesh,
        {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
        },
    )


# ---- 2. expert parallelism ---------------------------------------------------------------------
def native_collectives(ep_mesh, pool_group=None) -> Collectives:
    group = ep_mesh.get_group()
    return Collectives(
        all_to_all=lambda x, out_splits, in_splits: all_to_all_single_autograd(
            x.contiguous(), out_splits, in_splits, group
        ),
        exchange_counts=lambda counts: all_to_all_single(counts, None, None, group),
        all_reduce_sum=lambda t: dist_nn.all_reduce(t, group=pool_group or group),
        size=ep_mesh.size(),
        pool=dist.get_world_size(pool_group or group),
    )


class LocalExperts(Experts):
    """Experts whose weights are DTensors: forward runs this rank's shard (to_local)."""

    def forward(self, x, counts: list[int]):
        gate = self.c_fc2.to_local() if self.c_fc2 is not None else None
        return grouped_mlp(x, counts, self.c_fc.to_local(), gate, self.c_proj.to_local(), self.act)


def _shard_dim0(name, module, mesh):
    for pname, p in list(module.named_parameters(recurse=False)):
        module.register_parameter(pname, nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))


def apply_ep(model, ep_mesh, pool_group=None, fsdp_mesh=None, mp_policy: MixedPrecisionPolicy = NO_MIXED_PRECISION):
    """In place: every MoE's experts Shard(0) over ep_mesh, its dispatch across the mesh, its
    load-balancing statistics pooled over pool_group (default: the ep group). With fsdp_mesh, each
    layer's local experts are then FSDP2-sharded over it (a mesh of one is fine), their
    reduce-scatter divided by every pooled rank (the dense gradients' FSDP2 average over fsdp × ep;
    torchtitan's set_gradient_divide_factor)."""
    collectives = native_collectives(ep_mesh, pool_group)
    for moe in moe_layers(model):
        distribute_module(moe.experts, ep_mesh, _shard_dim0)
        moe.experts.__class__ = LocalExperts
    expert_parallel_moe(model, collectives, lambda moe: moe.experts)
    if fsdp_mesh is None:
        return
    for moe in moe_layers(model):
        # fewer local experts than fsdp ranks (Mixtral, ep 8: one): shard each expert's rows instead of
        # padding dim 0 to the fsdp size, which would leave every rank a whole expert (torchtitan does the same)
        few = moe.n_experts // ep_mesh.size() < fsdp_mesh.size()
        place = (lambda p: Shard(1)) if few else None
        fully_shard(moe.experts, mesh=fsdp_mesh, mp_policy=mp_policy, shard_placement_fn=place)
        moe.experts.set_gradient_divide_factor(float(collectives.pool))
        # a custom factor makes fp32/bf16 reduce-scatters PREMUL_SUM, which gloo lacks: divide
        # before and after a plain SUM there instead (what FSDP2 does for other dtypes)
        moe.experts.set_force_sum_reduction_for_comms(dist.get_backend() == "gloo")


# ---- 3. data parallelism -----------------------------------------------------------------------
def apply_fsdp(
    model, dp_mesh, mp_policy: MixedPrecisionPolicy = NO_MIXED_PRECISION, reshard_after_forward: bool = True
) -> None:
    """One FSDP2 group per block, then the root (embeddings, final norm, head): HSDP over a 2-D
    (replicate, shard) mesh; a shard axis of size 1 is plain DP (all-reduce over replicate). The
    root keeps FSDP2's default (None: not resharded after forward, it would be gathered again at once);
    reshard_after_forward=False keeps every block's gathered parameters until backward (ZeRO-2)."""
    for block in blocks(model):
        fully_shard(block, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    root = None if reshard_after_forward else False
    fully_shard(model, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=root)


def apply_ddp(model, dp_mesh, ignore: tuple[str, ...] = ()):
    """DDP over dp_mesh; `ignore` names parameters it leaves alone (EP's experts: each lives on one rank)."""
    if ignore:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(ignore))
    return DistributedDataParallel(model, process_group=dp_mesh.get_group())


def parallelize_gpt(model, mesh, plan: Plan):
    """TP on the mesh's tp axis, then a MoE's router statistics pooled over the data axes, then FSDP2
    over fsdp (or HSDP over dp×shard), else DDP over dp. Returns the model to train (DDP wraps it;
    the others change it in place). Under FSDP2 pass a meta-device model and materialise it
    afterwards (see NativeEngine)."""
    axes = mesh.mesh_dim_names
    if "tp" in axes:
        apply_tp(model, mesh["tp"], plan.sequence_parallel)
    pool_over_data_axes(model, mesh)
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
