"""Parallel training, from scratch and native: one descriptive plan (plan.py), one short file per
strategy (dp.py, tp.py, fsdp.py, pp.py on the MLP), native torch (native.py on MLP/GPT), JAX
(jax_mlp.py), a collective-byte counter (comm.py) and the torchrun launcher (launch.py, worker.py)."""
