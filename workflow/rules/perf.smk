# Single-device perf matrix: one job (and one MLflow run) per perf.cells entry.
# Every cell but a baseline depends on its baseline's metrics.json (speedup, loss drift, Change);
# perf.ladder cells (steps/perf/ladder.py) compare against their shape's baseline cell.
# threads = all cores: a perf job runs alone, so no other job steals cores from its timing.


def perf_baseline(wildcards):
    """The cell's baseline (the section's, or its ladder shape's baseline)."""
    base = cell_config(config, "perf", wildcards.cell)["params"]["baseline_cell"]
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
