# GPT from scratch: component parity, HF GPT-2 parity (one cell per config), training.

rule components:
    output: metrics="results/components/{cell}/metrics.json"
    params: **stage_params("steps.components")
    log: "results/logs/components/{cell}.log"
    benchmark: "results/benchmarks/components/{cell}.tsv"
    threads: cell_threads("job_threads")
    conda: LAB_ENV
    shell: STAGE_SHELL


rule gpt_parity:
    output: metrics="results/gpt_parity/{cell}/metrics.json"
    params: **stage_params("steps.gpt_parity")
    log: "results/logs/gpt_parity/{cell}.log"
    benchmark: "results/benchmarks/gpt_parity/{cell}.tsv"
    resources: gpu=job_gpus()
    threads: cell_threads("job_threads")
    conda: LAB_ENV
    shell: STAGE_SHELL


rule gpt_train:
    input:
        corpus=rules.prepare_corpus.output.data,
        tokenizer=rules.train_tokenizer.output.data,
        # a fine-tuning cell (init_from) starts from that cell's checkpoint, written beside its metrics
        base=lambda wildcards: [f"results/gpt_train/{c}/metrics.json"]
        if (c := cell_params("gpt_train", wildcards).get("init_from")) else [],
    output: metrics="results/gpt_train/{cell}/metrics.json"
    params: **stage_params("steps.gpt_train")
    log: "results/logs/gpt_train/{cell}.log"
    benchmark: "results/benchmarks/gpt_train/{cell}.tsv"
    resources: gpu=job_gpus()
    threads: config["threads"]
    conda: LAB_ENV
    shell: STAGE_SHELL
