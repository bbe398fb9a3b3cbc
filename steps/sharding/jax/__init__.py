"""The plan in JAX, on N devices in one process (N CPU host devices or N GPUs: launch.jax_env).

Imports go one way: models -> engine -> entry point; the lessons stand apart.
  specs.py     PartitionSpec per parameter role and strategy, remat under FSDP (models' base)
  toy_mlp.py     the toy MLP                       } models: weights, specs, forward,
  gpt_blocks.py  our GPT's transformer blocks      } batches, analytic costs
  moe_blocks.py  MoE blocks under shard_map (EP)   }
  measure.py   collectives read from compiled HLO, per-device bytes, sharding rendering
  engine.py    the jitted train step: JitEngine (GSPMD) and ShardMapEngine (explicit collectives)
  lessons.py   jit vs eager, branching under jit, sharding renderings (imports the engine)
  __main__.py  `python -m steps.sharding.jax --plan JSON --out DIR`: the process launch.py starts
Nothing here may be imported before launch.jax_env's JAX_PLATFORMS / XLA_FLAGS are set, i.e.
outside that process (tests excepted, where one CPU device is enough).
"""
