"""The GPU campaign: one command that turns a lent GPU's device time into a dated results record.

    scripts/gpu-campaign [--budget 420] [--out DIR] [--wheels DIR]    # on the lent CUDA machine
    scripts/gpu-campaign --budget 240 --skip-done FIRST/campaign.json  # a second call: what is not ok yet
    scripts/gpu-campaign --rehearse                                  # the same on the CPU, tiny shapes
    python -m steps.campaign.record OUT                              # the record from a returned $OUT

  wheels.py   install what the image lacks from a folder of wheels (offline)
  plan.py     the cells, most valuable first (the perf ladder's baseline and last rung lead)
  run.py      each cell a stage job within the time budget; the ledger campaign.json (records embedded)
  rerun.py    --skip-done: carry an earlier call's ok cells, run the rest
  record.py   docs/results/<date>-<device>-<commit>.md from the cells' records
  __main__.py the command line

Everything but CUDA itself is rehearsed on the CPU (configs/gpu-rehearse.yaml, tests/test_gpu_campaign.py).
"""
