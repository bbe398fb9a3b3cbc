# Single-device perf matrix: one job (and one MLflow run) per perf.cells entry.
from steps.perf.cuda_only import cuda_only_reason

rule perf:
    input:
        # Every cell but a baseline reads its baseline's metrics.json (speedup, loss drift, Change):
        # the section's baseline_cell, or for perf.ladder cells (steps/config/ladder.py) their shape's.
        unpack(lambda wildcards: {}
               if wildcards.cell == (base := cell_params("perf", wildcards)["baseline_cell"])
               else {"baseline": expand(rules.perf.output.metrics, cell=base)[0]}),
    output: metrics="results/perf/{cell}/metrics.json"
    params: **stage_params("steps.perf")
    log: "results/logs/perf/{cell}.log"
    benchmark: "results/benchmarks/perf/{cell}.tsv"
    resources: gpu=job_gpus()
    # A perf job runs alone, so no other job steals cores from its timing: it asks every core of a
    # local run (--cores). A cluster run gives no --cores: there the job asks the config's `threads`,
    # and its allocation's cores are its own (a profile's set-threads asks more); the job, re-planned
    # on its node (not the main process, `--cores all` there), must ask the same or its step exceeds
    # the allocation. A cell that only skips here (a CUDA-only knob on a CPU device) asks one core.
    threads: lambda wildcards: 1 if config["device"] == "cpu" and cuda_only_reason(cell_params("perf", wildcards)) else
                               (workflow.global_resources["_cores"].value if workflow.is_main_process else None)
                               or config["threads"]
    conda: LAB_ENV
    shell: STAGE_SHELL
