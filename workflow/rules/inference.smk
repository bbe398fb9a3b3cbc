# Inference: decoding with and without the KV cache, MHA/GQA/MQA, batching, ours vs HF (one job per cell).

rule inference:
    output: metrics="results/inference/{cell}/metrics.json"
    params: **stage_params("steps.inference")
    log: "results/logs/inference/{cell}.log"
    benchmark: "results/benchmarks/inference/{cell}.tsv"
    resources: gpu=job_gpus()
    threads: cell_threads("job_threads")
    conda: LAB_ENV
    shell: STAGE_SHELL
