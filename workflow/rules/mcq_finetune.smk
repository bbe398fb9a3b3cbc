# Kaggle LLM Science Exam: HF Trainer fine-tuning matrix (zero-shot/fine-tuned x context/none).

rule mcq_finetune:
    input: unpack(mcq_input)
    output: metrics="results/mcq_finetune/{cell}/metrics.json"
    params: **stage_params()
    log: "results/logs/mcq_finetune/{cell}.log"
    benchmark: "results/benchmarks/mcq_finetune/{cell}.tsv"
    resources: gpu=job_gpus()
    threads: config["threads"]
    conda: LAB_ENV
    shell: STAGE_SHELL
