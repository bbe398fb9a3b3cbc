"""The production APIs on our GPT (steps/models/gpt.py), applied imperatively from the plan
(the TorchTitan `parallelize_*` lesson):

  dp      DistributedDataParallel
  fsdp    FSDP2 `fully_shard` per block + root, built on the meta device, shards materialised
          from rank 0's full state dict (to_empty + set_model_state_dict broadcast_from_rank0)
  tp      `parallelize_module`: q/k/v/c_fc ColwiseParallel, o_proj/c_proj RowwiseParallel
          (+ SequenceParallel on the norms when plan.sequence_parallel)
  pp      torch.distributed.pipelining PipelineStage + ScheduleGPipe / Schedule1F1B (untied head:
          wte and lm_head live on different stages)
  dp_tp   TP on the inner mesh axis, replicated over the outer one with HSDP (shard size 1)
  fsdp_tp TP on the inner axis, FSDP2 over the outer one (2-D)
Every engine exposes the same train_step / full_state / analytic as the from-scratch one.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from steps.parallel import analytic as A
from steps.parallel import comm
from steps.parallel.plan import Plan


def gpt_config(plan: Plan):
    from steps.models.gpt import GPTConfig
    return GPTConfig(**plan.gpt, dropout=0.0, tie_weights=plan.strategy != "pp")


def full_model(plan: Plan, dtype):
    """The single-device model every engine starts from (same seed -> same weights)."""
    from steps.models.gpt import GPTLMHeadModel
    torch.manual_seed(plan.seed)
    return GPTLMHeadModel(gpt_config(plan)).to(dtype)


def gpt_batch(plan: Plan, step: int) -> torch.Tensor:
    rng = np.random.default_rng([plan.seed, step])
    return torch.tensor(rng.integers(0, plan.gpt["vocab_size"], (plan.batch_size, plan.gpt["block_size"])))


def param_shapes(model) -> dict[str, int]:
    return {k: p.numel() for k, p in model.named_parameters()}


def reference(plan: Plan, dtype):
    """One device, same weights and global batches, gpt_train's training step with the plan's
    optimizer (no clipping: the sharded engines do not clip): per-step losses and gradients,
    final parameters."""
    from steps.models.train_step import StepOptions, TrainStep
    model = full_model(plan, dtype)
    ts = TrainStep(model, torch.get_default_device(), StepOptions(grad_clip=0.0),
                   optimizer=plan.optimizer_for(model.parameters()))
    losses, grads = [], []

    def record_grads(label):
        if label == "after backward":
            grads.append({k: p.grad.detach().clone() for k, p in model.named_parameters()})

    for step in range(plan.steps):
        loss, _ = ts.step([gpt_batch(plan, step)], probe=record_grads)
        losses.append(loss)
    return losses, grads, {k: p.detach().clone() for k, p in model.named_parameters()}


def tp_plan(sequence_parallel: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    out = Shard(1) if sequence_parallel else Replicate()
    p = {f"attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
    p.update({"attn.o_proj": RowwiseParallel(output_layouts=out), "mlp.c_fc": ColwiseParallel(),
              "mlp.c_proj": RowwiseParallel(output_layouts=out)})
    if sequence_parallel:  # norms and residual on T/tp rows; all-gather before attn/mlp, reduce-scatter after
        p.update({"ln_1": SequenceParallel(use_local_output=True), "ln_2": SequenceParallel(use_local_output=True),
                  "attn": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                             desired_input_layouts=(Replicate(), None, None)),
                  "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))})
    else:  # one DTensor input for q, k and v: their partial input grads are summed, then all-reduced once
        p["attn"] = PrepareModuleInput(input_layouts=(Replicate(), None, None),
                                       desired_input_layouts=(Replicate(), None, None))
    return p


def apply_tp(model, mesh, sequence_parallel: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module
    for block in model.transformer.h:
        parallelize_module(block, mesh, tp_plan(sequence_parallel))
    if sequence_parallel:  # enter the sequence-sharded region at the first block, leave it at ln_f
        parallelize_module(model.transformer.h[0], mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True))
        parallelize_module(model.transformer.ln_f, mesh, PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True))


def _device_type() -> str:
    return torch.get_default_device().type  # the worker sets cuda under NCCL


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


class NativeEngine:
    def __init__(self, plan: Plan, dtype):
        from torch.distributed.device_mesh import init_device_mesh
        self.plan, s = plan, plan.strategy
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        names = tuple(plan.mesh)
        self.mesh = init_device_mesh(_device_type(), tuple(plan.mesh.values()), mesh_dim_names=names)
        self.data_rank = self.mesh.get_local_rank(plan.data_axis) if plan.data_axis else 0
        self.data_size = plan.axis(plan.data_axis) if plan.data_axis else 1
        self.notes = ""
        ref = full_model(plan, dtype)
        self.shapes = param_shapes(ref)
        self.stage_params = None
        if s == "dp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.model = DDP(ref)
        elif s == "tp":
            apply_tp(ref, self.mesh, plan.sequence_parallel)
            self.model = ref
        elif s in ("fsdp", "fsdp_tp", "dp_tp"):
            self.model = self._fsdp(ref, dtype)
        elif s == "pp":
            self._pipeline(ref)
        else:
            raise ValueError(f"torch_native has no strategy {s!r}")

    def _fsdp(self, ref, dtype):
        """Meta-device init: no rank ever holds the full model except rank 0's state dict."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.fsdp import fully_shard
        from steps.models.gpt import GPTLMHeadModel
        full_sd = ref.state_dict() if self.rank == 0 else {}
        with torch.device("meta"):
            model = GPTLMHeadModel(gpt_config(self.plan)).to(dtype)
        if self.plan.strategy == "dp_tp":
            # DDP does not compose with DTensor TP; replicate with HSDP whose shard axis has size 1
            # (TorchTitan's dp_replicate): reduce-scatter over 1 rank is free, the all-reduce is DP's 2Ψ
            from torch.distributed.device_mesh import init_device_mesh
            sizes = (self.plan.axis("dp"), 1, self.plan.axis("tp"))
            self.mesh = init_device_mesh(_device_type(), sizes, mesh_dim_names=("dp", "shard", "tp"))
            fsdp_mesh = self.mesh["dp", "shard"]
        else:
            fsdp_mesh = self.mesh["fsdp"]
        if "tp" in self.plan.mesh:
            apply_tp(model, self.mesh["tp"], self.plan.sequence_parallel)
        for block in model.transformer.h:
            fully_shard(block, mesh=fsdp_mesh)
        fully_shard(model, mesh=fsdp_mesh)
        model.to_empty(device=_device_type())
        set_model_state_dict(model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        return model

    def _pipeline(self, ref):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        from steps.models.gpt import causal_lm_loss
        S, L = self.world, self.plan.gpt["n_layer"]
        per = L // S
        keep = range(self.rank * per, (self.rank + 1) * per)
        stage = _GPTStage(ref, keep, first=self.rank == 0, last=self.rank == S - 1)
        mine = {id(p) for p in stage.parameters()}
        self.stage_names = [k for k, p in ref.named_parameters() if id(p) in mine]
        self.stage_params = sum(p.numel() for p in stage.parameters())
        self.ref_model, self.model = ref, stage
        pstage = PipelineStage(stage, self.rank, S, torch.get_default_device())
        cls = ScheduleGPipe if self.plan.schedule == "gpipe" else Schedule1F1B
        self.schedule = cls(pstage, n_microbatches=self.plan.microbatches, loss_fn=causal_lm_loss)

    # ---- the engine interface -----------------------------------------------------------------
    def batch(self, step: int, dtype):
        ids = gpt_batch(self.plan, step)
        return ids.chunk(self.data_size)[self.data_rank]

    def train_step(self, ids) -> torch.Tensor:
        if self.plan.strategy != "pp":
            loss = self.model(ids, labels=ids).loss
            loss.backward()
            return full_tensor(loss)
        losses = []
        if self.rank == 0:
            self.schedule.step(ids)
        elif self.rank == self.world - 1:
            self.schedule.step(target=ids, losses=losses)
        else:
            self.schedule.step()
        dtype = next(self.model.parameters()).dtype
        loss = torch.stack(losses).mean().to(dtype) if losses else torch.zeros((), dtype=dtype)
        dist.broadcast(loss, src=self.world - 1)  # reporting only
        return loss

    @torch.no_grad()
    def full_state(self, kind: str = "param") -> dict[str, torch.Tensor]:
        def pick(p):
            return full_tensor(p if kind == "param" else p.grad)
        if self.plan.strategy == "pp":  # every stage's tensors, gathered on the CPU
            mine = dict(self.ref_model.named_parameters())
            return comm.gather_state({k: pick(mine[k]) for k in self.stage_names})
        model = self.model.module if hasattr(self.model, "module") else self.model
        return {k: pick(p) for k, p in model.named_parameters()}

    def analytic(self) -> dict:
        local = A.gpt_local_params(self.plan, self.shapes, self.stage_params)
        return {"state_bytes": self.plan.state_tensors * local * self.plan.bytes_per_elem,
                "comm_bytes": A.gpt_comm(self.plan, self.shapes), "params": sum(self.shapes.values())}


class _GPTStage(torch.nn.Module):
    """One pipeline stage: (embeddings) + its blocks (+ final norm and head)."""

    def __init__(self, model, keep: range, first: bool, last: bool):
        super().__init__()
        t = model.transformer
        self.first, self.last = first, last
        self.wte, self.wpe = (t.wte, t.wpe) if first else (None, None)
        self.h = torch.nn.ModuleList(t.h[i] for i in keep)
        self.ln_f, self.lm_head = (t.ln_f, model.lm_head) if last else (None, None)

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x
