# Kaggle LLM Science Exam: HF Trainer fine-tuning matrix (zero-shot/fine-tuned x context/none).

rule mcq_finetune:
    input: lambda wildcards: config["mcq_finetune"]["data"]
    output: metrics="results/mcq_finetune/{cell}/metrics.json"
    params: cfg=job_config(register("mcq_finetune"))
    log: "results/logs/mcq_finetune/{cell}.log"
    benchmark: "results/benchmarks/mcq_finetune/{cell}.tsv"
    resources: gpu=job_gpus("mcq_finetune")
    threads: config["threads"]
    shell: STAGE_SHELL
