# Sharding matrix: one job per parallelism plan; each job launches its own ranks (torchrun or
# N JAX host devices) and owns the cell's single MLflow run. `job_threads` (default 1) is what the
# scheduler reserves: ranks mostly import libraries, so two cells can share 2 cores.

rule sharding:
    output: metrics="results/sharding/{cell}/metrics.json"
    params: **stage_params("steps.sharding")
    log: "results/logs/sharding/{cell}.log"
    benchmark: "results/benchmarks/sharding/{cell}.tsv"
    # A cell's devices per node: its torch ranks, or its JAX mesh, over its nodes (steps/sharding/launch.py).
    resources:
        gpu=job_gpus(lambda p: math.ceil(math.prod((p.get("mesh") or {}).values())
                                         / max(int((p.get("launch") or {}).get("nnodes") or 1), 1))),
    threads: cell_threads("job_threads")
    conda: LAB_ENV
    shell: STAGE_SHELL
