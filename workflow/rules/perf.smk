# Single-device perf matrix: one job (and one MLflow run) per perf.cells entry.
# Every cell but a baseline depends on its baseline's metrics.json (speedup, loss drift, Change);
# perf.ladder cells (steps/config/ladder.py) compare against their shape's baseline cell.
# threads = all cores (all_cores): a perf job runs alone, so no other job steals cores from its timing.

rule perf:
    input: unpack(perf_baseline)
    output: metrics="results/perf/{cell}/metrics.json"
    params: **stage_params()
    log: "results/logs/perf/{cell}.log"
    benchmark: "results/benchmarks/perf/{cell}.tsv"
    resources: gpu=job_gpus()
    threads: all_cores
    conda: LAB_ENV
    shell: STAGE_SHELL
