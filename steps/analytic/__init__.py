"""What a training step should cost, from its config alone: the lab's one analytic model of memory,
communication and FLOPs. No torch, no JAX: the stages' launching sides and the report may import it.

  params.py       parameter counts: a GPTConfig by group; one rank's after TP, FSDP, PP, EP
  memory.py       bytes held: one GPU's eager step (perf), one rank's state at scale (Playbook, held)
  activations.py  saved activations per layer and token at scale (TP, SP, AC; Korthikanti's formula)
  comm.py         the ring convention and every collective's bytes (sharding, scale; EP all-to-all)
  costs.py        a sharding engine's analytic(): state, comm and parameters of its plan (MLP, GPT,
                  the JAX MoE blocks' GShard dispatch)
  flops.py        model FLOPs per token (6N + 12·L·d·T)
  inference_partition.py  Pope et al. 2022's inference layouts on a TPU torus: per-chip memory, comm,
                  latency, MFU (the inference stage's partition cell)

Who reads it: the perf stage (memory.step_memory, timeline_bytes: analytic next to measured bytes),
the sharding stage's engines (costs.mlp_costs / gpt_costs; comm.ring_bytes counts their
collectives), the scale stage (memory.state / held_state, activations, comm.by_collective, on a
steps.models.shapes.Shape), and every MFU (flops.flops_per_token).
"""
