# Data: the corpus (HF datasets), a byte-level BPE tokenizer, and Kaggle-format MCQ splits.

rule prepare_corpus:
    output:
        data=directory("results/data/corpus"),
        metrics="results/prepare_corpus/main/metrics.json",
    params: **stage_params("steps.prepare_corpus")
    log: "results/logs/prepare_corpus/main.log"
    benchmark: "results/benchmarks/prepare_corpus/main.tsv"
    threads: 1
    conda: LAB_ENV
    shell: STAGE_SHELL


rule train_tokenizer:
    input:
        corpus=rules.prepare_corpus.output.data,
    output:
        data=directory("results/data/tokenizer"),
        metrics="results/train_tokenizer/main/metrics.json",
    params: **stage_params("steps.train_tokenizer")
    log: "results/logs/train_tokenizer/main.log"
    benchmark: "results/benchmarks/train_tokenizer/main.tsv"
    threads: 1
    conda: LAB_ENV
    shell: STAGE_SHELL


rule prepare_mcq:
    output:
        data=directory("results/data/mcq"),
        metrics="results/prepare_mcq/main/metrics.json",
    params: **stage_params("steps.prepare_mcq")
    log: "results/logs/prepare_mcq/main.log"
    benchmark: "results/benchmarks/prepare_mcq/main.tsv"
    threads: 1
    conda: LAB_ENV
    shell: STAGE_SHELL
