"""Stage `scale`: one (model, cluster, plan) per cell, at 8 to 1,024 GPUs, without a GPU.

The stage is this package: `python -m steps.scale` (__main__.py) runs stage.py's `run`. The rest is
sharding beyond this machine: per-GPU memory, communication and step time of a training plan on
meshes of 8 to 1,024 GPUs, simulated in one process and modelled analytically (the `scale` stage,
stage.py). The model's shape is steps/models/shapes.py's (Shape: parameter counts by group,
model FLOPs per token); the Playbook's formulas (ZeRO-0..3 state, activations per layer, comm per
strategy) are steps/analytic/'s. One concern a file:

  scale_plan.py ScalePlan: the mesh (steps/sharding/plan.py's vocabulary), ZeRO stage, SP, AC, batch
  recipe.py     the real model (HF Llama, our GPT) under a FakeTensorMode and how the rank trains it;
                parallelized by steps/sharding/native/parallelize.py, the sharding stage's path
  fakeworld.py  one rank of a W-rank step on torch's fake process group: state, saved, comm bytes
  balanced_moe.py  the MoE GPT on the fake group: balanced routing (EP: parallelize.apply_ep)
  versus.py     which step a plan's simulation runs (ZeRO-2, SP, full AC included) and which formula
                each simulated number is set against
  replay_sharding.py  the sharding stage's gloo cells replayed on the fake group, against their ranks' bytes
  cluster.py    a cluster description and the α–β cost of each collective on it
  steptime.py   compute, exposed communication, pipeline bubble -> tokens/s per GPU, MFU, fits (the
                stage logs them as predicted_*: never the measured names of perf and gpt_train)
  search.py     the best plan that fits, for a model, a global batch and a cluster
  figures.py    the report's plots (memory and tokens/s per GPU against world size)
"""


def __getattr__(name):  # `STAGE` imports the stage (steps.core, pandas) only when asked for
    if name == "STAGE":
        from steps.scale.stage import STAGE

        return STAGE
    raise AttributeError(f"module 'steps.scale' has no attribute {name!r}")
