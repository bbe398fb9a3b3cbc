"""Parallel training, from scratch and native, torch and JAX, one concern a file.

plan.py       the descriptive plan of a cell (mesh, strategy, schedule, model); no torch/jax
engines.py    (backend, strategy) -> the engine that runs it, and the engine protocols
launch.py     where a cell runs (GPUs, backends) and starting its processes; fail fast
nodes.py      across hosts: each node's place (config or SLURM), its interface, the unreachable node
links.py      which mesh axis crosses the host boundary, and the bytes on each link
worker.py     one torch rank's loop: train K steps, measure, compare with the reference
comm.py       torch collectives through a byte counter (scratch) and a dispatch-mode counter (native);
              what each strategy should cost, and the ring factors: steps/analytic/ (costs.py, comm.py)
reference.py  the single-device torch references;  parity.py  the one parity helper
mlp.py, mlp_init.py, gpt.py   the models as the torch engines build them (numpy weights for the MLP)
scratch/      dp.py, tp.py, fsdp.py, pp.py on the MLP; engine.py
native/       parallelize.py (parallelize_gpt: TP, then FSDP2 or DDP), pipeline.py (pipeline_gpt); engine.py
jax/          specs, mlp, gpt (models) -> engine -> __main__ (entry point); lessons apart
"""
