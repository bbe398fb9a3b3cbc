"""inference: the decode side — KV cache, MHA/GQA/MQA, batching, ours vs HF (steps/inference/cells.py)."""

from __future__ import annotations

from steps.core import Stage, StageRun
from steps.inference import cells, sweeps
from steps.inference.config import InferenceConfig
from steps.inference.partition_cell import partition
from steps.presentation.inference import SHOWN

KINDS = {
    "parity": cells.parity,
    "kv_cache": cells.kv_cache,
    "attention": sweeps.attention,
    "batching": sweeps.batching,
    "vs_hf": sweeps.vs_hf,
    "partition": partition,
}


def run(ctx: StageRun) -> dict:
    p = InferenceConfig.of(ctx.params)
    ctx.use_threads(p.job_threads)
    return KINDS[p.kind](ctx, p, ctx.device)


STAGE = Stage.of("steps.inference", run, SHOWN)
