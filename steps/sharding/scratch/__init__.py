"""Parallelism from scratch on the toy MLP, one short file per technique, siblings of one shape
(picotron's layout): a docstring saying what is split and what moves, the communication glue, and
a wrapper with train_step(x, y) and full_state(kind).

  dp.py    DataParallel: replicas, one all-reduce of the gradients (2Ψ)
  tp.py    TensorParallelMLP: Megatron column/row-parallel blocks (copy-to / reduce-from regions)
  fsdp.py  FullyShardedMLP: ZeRO-3 flat shards, all-gather / reduce-scatter per block (3Ψ)
  zero1.py ZeRO1MLP: whole replicas, Adam's moments for this rank's slice only (2Ψ)
  zero2.py ZeRO2MLP: ZeRO-1 with each block's gradient reduce-scattered in backward and freed (2Ψ)
  pp.py    PipelineMLP: stages with send/recv, GPipe or 1F1B schedules
  engine.py  ScratchEngine: builds one of them (or dp×tp) from the plan for the rank loop
"""
