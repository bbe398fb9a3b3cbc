# miniTorch: the from-scratch engine, one cell per model × backend (steps/minitorch/stage.py).
# Every cell gets the corpus and the tokenizer (the GPT trains on the plays' tokens, the classifier
# reads their passages); the ops cells leave them unread.

rule minitorch:
    input:
        corpus=rules.prepare_corpus.output.data,
        tokenizer=rules.train_tokenizer.output.data,
    output: metrics="results/minitorch/{cell}/metrics.json"
    params: **stage_params("steps.minitorch")
    log: "results/logs/minitorch/{cell}.log"
    benchmark: "results/benchmarks/minitorch/{cell}.tsv"
    resources: gpu=job_gpus(lambda p: int(p["backend"] == "cuda"))
    threads: cell_threads("job_threads")
    conda: LAB_ENV
    shell: STAGE_SHELL
