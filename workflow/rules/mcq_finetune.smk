# Kaggle LLM Science Exam: HF Trainer fine-tuning matrix (zero-shot/fine-tuned x context/none).

rule mcq_finetune:
    input:
        # The splits a cell reads: mcq_finetune.data (a Kaggle folder), else prepare_mcq's.
        unpack(lambda wildcards: {"data": cell_params("mcq_finetune", wildcards)["data"] or rules.prepare_mcq.output.data}),
    output: metrics="results/mcq_finetune/{cell}/metrics.json"
    params: **stage_params("steps.mcq_finetune")
    log: "results/logs/mcq_finetune/{cell}.log"
    benchmark: "results/benchmarks/mcq_finetune/{cell}.tsv"
    resources: gpu=job_gpus()
    threads: config["threads"]
    conda: LAB_ENV
    shell: STAGE_SHELL
