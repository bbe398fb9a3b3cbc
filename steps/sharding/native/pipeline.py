"""pipeline_gpt: our GPT cut into S stages of n_layer/S blocks (torch.distributed.pipelining),
each stage on its rank with a GPipe or 1F1B schedule. The head is untied under PP (wte on the
first stage, lm_head on the last: gpt.gpt_config)."""

from __future__ import annotations

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from steps.models.gpt import causal_lm_loss
from steps.sharding.plan import Plan

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class GPTStage(torch.nn.Module):
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


def pipeline_gpt(model, plan: Plan, rank: int, stages: int):
    """This rank's stage of `model` (sharing its parameters) and the plan's schedule over it."""
    per = plan.gpt["n_layer"] // stages
    stage = GPTStage(model, range(rank * per, (rank + 1) * per), first=rank == 0, last=rank == stages - 1)
    pstage = PipelineStage(stage, rank, stages, torch.get_default_device())
    schedule = SCHEDULES[plan.schedule](pstage, n_microbatches=plan.microbatches, loss_fn=causal_lm_loss)
    return stage, schedule


def run_schedule(schedule, stage: int, stages: int, ids: torch.Tensor, dtype) -> torch.Tensor:
    """One step of `schedule` from stage `stage` of `stages`: the first stage feeds the ids, the last
    takes them as targets and returns its microbatches' mean loss; the others return 0 (the caller
    broadcasts the last stage's)."""
    losses = []
    if stage == 0:
        schedule.step(ids)
    elif stage == stages - 1:
        schedule.step(target=ids, losses=losses)
    else:
        schedule.step()
    return torch.stack(losses).mean().to(dtype) if losses else torch.zeros((), dtype=dtype)
