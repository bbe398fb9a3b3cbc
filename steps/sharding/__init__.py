"""Stage `sharding`: one parallelism plan per cell, run as real processes, checked against one device.

The stage is this package: `python -m steps.sharding` (__main__.py) runs stage.py's `run`. The rest
is parallel training, from scratch and native, torch and JAX, one concern a file.

stage.py      the stage: a cell's plan launched (launch.py), its ranks' records summarized and logged
summary.py    a cell's metrics from its ranks' records (the stage's and a node launcher's)
plan.py       the plan vocabulary (mesh AXES, PlanError, MeshPlan) and a cell's descriptive Plan
              (mesh, strategy, schedule, model), the sharding section's dataclass; no torch/jax. The
              scale stage's ScalePlan builds on it. plan_sections.py: its mlp, launch and fault
engines.py    (backend, strategy) -> the engine that runs it, and the engine protocols
launch.py     where a cell runs (GPUs, backends) and starting its processes; fail fast
nodes.py      across hosts: each node's place (config or SLURM), its interface, the unreachable node
links.py      which mesh axis crosses the host boundary, and the bytes on each link
worker.py     one torch rank's loop: train K steps, measure, compare with the reference
comm.py       torch collectives through a byte counter (scratch) and a dispatch-mode counter (native);
              what each strategy should cost, and the ring factors: steps/analytic/ (costs.py, comm.py)
reference.py  the single-device torch references;  parity.py  the one parity helper
toy_mlp.py, toy_mlp_init.py  the toy MLP the scratch engines shard (its numpy weights and batches)
gpt_init.py   our GPT as the torch engines build it: config from the plan, seeded weights, batches
expert_parallel.py  the EP dispatch schedule on the MoE GPT, shared by scratch/ep.py and native/ep.py
scratch/      dp.py, tp.py, fsdp.py, pp.py on the MLP; engine.py
native/       parallelize.py (the one parallelize path: apply_tp, apply_ep, apply_fsdp, apply_ddp;
              parallelize_gpt), pipeline.py (pipeline_gpt); engine.py, ep.py. The scale simulator uses it too
jax/          specs, toy_mlp, gpt_blocks, moe_blocks (models) -> engine -> __main__ (entry point); lessons apart
"""


def __getattr__(name):  # `STAGE` imports the stage (steps.core, pandas) only when asked for: a rank never does
    if name == "STAGE":
        from steps.sharding.stage import STAGE

        return STAGE
    raise AttributeError(f"module 'steps.sharding' has no attribute {name!r}")
