# Sharding matrix: one job per parallelism plan; each job launches its own ranks (torchrun or
# N JAX host devices) and owns the cell's single MLflow run. World-size-2 cells use both cores.

rule sharding:
    output: metrics="results/sharding/{cell}/metrics.json"
    params: cfg=job_config(register("sharding"))
    log: "results/logs/sharding/{cell}.log"
    benchmark: "results/benchmarks/sharding/{cell}.tsv"
    threads: 2
    shell: STAGE_SHELL
