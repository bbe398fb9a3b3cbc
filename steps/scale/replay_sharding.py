"""Checked against our own runs: the sharding stage's native-torch GPT cells (gloo, world 2 to 4,
steps/sharding/stage.py) replayed by the scale simulator on the fake process group, and the simulated
per-rank state and communication bytes set against what the gloo ranks measured.

The replay takes the cell's plan (steps/sharding/plan.py) and goes through the simulator's own
path (recipe.py, fakeworld.py), not the sharding stage's engine: the same GPT config, dtype and
optimizer (the cell's Recipe: no mixed-precision policy, the model's own loss), the same mesh and
per-rank batch slice, TP and FSDP2 by the stage's own parallelize.py (apply_tp, apply_fsdp: per block, then the root).
A data axis without sharding (the cell's DDP, or its HSDP over (dp, shard=1) under dp×tp) is
simulated as HSDP with a shard axis of one, which moves the same bytes (one fp32 all-reduce of
the gradients) and keeps the same state. Rank 0 is simulated; it is compared with rank 0's record.
"""

from __future__ import annotations

import json
from pathlib import Path

from steps.models.gpt import GPTConfig
from steps.models.shapes import Shape
from steps.scale import fakeworld as fw
from steps.scale import recipe as R
from steps.sharding.plan import Plan

SIMULABLE = ("dp", "fsdp", "tp", "dp_tp", "fsdp_tp")  # pipeline cells stay the sharding stage's own


def shape_of(gpt: dict) -> Shape:
    """The sharding section's `gpt` (GPTConfig fields) as a scale Shape of family gpt2."""
    cfg = GPTConfig(**gpt)
    return Shape(
        "sharding.gpt", "gpt2", cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.kv_heads, cfg.mlp_width, cfg.vocab_size,
        cfg.block_size,
    )  # fmt: skip


def replay(plan) -> dict:
    """Rank 0 of the cell `plan` (a steps.sharding.plan.Plan), one step on the fake group."""
    if plan.backend != "torch_native" or plan.model != "gpt" or plan.strategy not in SIMULABLE:
        raise ValueError(
            f"only the torch_native GPT cells of strategies {SIMULABLE} are replayed "
            f"(got {plan.backend}/{plan.model}/{plan.strategy})"
        )
    shaped = ("n_embd", "n_head", "n_layer", "vocab_size", "block_size", "n_kv_head", "mlp_hidden")
    extra = {k: v for k, v in plan.gpt.items() if k not in shaped}
    extra |= {"dropout": 0.0, "tie_weights": True}  # steps/sharding/gpt_init.py: gpt_config
    recipe = R.Recipe(
        mixed=False, optimizer=plan.optimizer, own_loss=True, sp=plan.sequence_parallel, dtype=plan.dtype, gpt=extra
    )
    sizes = {a: plan.axis(a) for a in ("dp", "fsdp", "tp")}
    shape = shape_of(plan.gpt)
    data = plan.axis(plan.data_axis) if plan.data_axis else 1
    mesh = fw.mesh_for(sizes)
    step = fw.one_step(shape, mesh, shape.layers, plan.batch_size // data, shape.max_seq, recipe)
    return {"state_bytes": step.state, "comm_bytes": sum(step.comm.values()), "comm": dict(step.comm)}


def measured(metrics_json: str | Path) -> dict:
    """Rank 0's record of a sharding cell (ranks/rank0.json beside its metrics.json): state after
    the last step, communication of the first step (the one the replay runs; DDP adds a 76-byte
    broadcast of its rebuilt bucket order at the second step, once) and of every step."""
    rank0 = json.loads((Path(metrics_json).parent / "ranks" / "rank0.json").read_text())
    return {
        "state_bytes": sum(rank0["state_bytes"].values()),
        "comm_bytes": rank0["comm_bytes"][0],
        "comm_steps": rank0["comm_bytes"],
    }


def check(plans: dict, inputs: dict) -> list[dict]:
    """Each sharding cell of `plans` (name -> its resolved params) replayed and set against its
    gloo record `inputs[name]` (its metrics.json)."""
    rows = []
    for name, params in plans.items():
        plan = Plan.from_params({**params, "seed": 0})
        sim, got = replay(plan), measured(inputs[name])
        rows.append(
            {
                "cell": name,
                "world": plan.world,
                **{
                    f"{k}_{s}": v for s, d in (("sim", sim), ("gloo", got)) for k, v in d.items() if k.endswith("bytes")
                },
                "state_ratio": sim["state_bytes"] / got["state_bytes"],
                "comm_ratio": sim["comm_bytes"] / got["comm_bytes"],
            }
        )
    return rows
