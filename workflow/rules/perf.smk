# Single-device perf matrix: one job (and one MLflow run) per perf.cells entry.
# Every cell but the baseline depends on the baseline's metrics.json (speedup, loss drift, Change).
# threads = all cores: a perf job runs alone, so no other job steals cores from its timing.


def perf_baseline(wildcards):
    base = config["perf"]["baseline_cell"]
    return [] if wildcards.cell == base else [f"results/perf/{base}/metrics.json"]


rule perf:
    input: perf_baseline
    output: metrics="results/perf/{cell}/metrics.json"
    params: cfg=job_config(register("perf"))
    log: "results/logs/perf/{cell}.log"
    benchmark: "results/benchmarks/perf/{cell}.tsv"
    resources: gpu=job_gpus("perf")
    threads: workflow.cores
    shell: STAGE_SHELL
