"""The GPU campaign: one command that turns a lent GPU's device time into a dated results record.

    scripts/gpu-campaign [--budget 540] [--out DIR] [--wheels DIR]    # on the lent CUDA machine
    scripts/gpu-campaign --rehearse                                  # the same on the CPU, tiny shapes

  wheels.py   install what the image lacks from a folder of wheels (offline)
  plan.py     the cells, most valuable first (the perf ladder's baseline and last rung lead)
  run.py      each cell a stage job within the time budget; the ledger campaign.json
  record.py   docs/results/<date>-<device>-<commit>.md from the cells' records
  __main__.py the command line

Everything but CUDA itself is rehearsed on the CPU (configs/gpu-rehearse.yaml, tests/test_gpu_campaign.py).
"""
