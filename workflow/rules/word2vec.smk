# word2vec: SGNS in PyTorch (optimizer cells), gensim on the same tokens, pretrained LM embeddings.

rule word2vec:
    input: unpack(word2vec_input)
    output: metrics="results/word2vec/{cell}/metrics.json"
    params: **stage_params()
    log: "results/logs/word2vec/{cell}.log"
    benchmark: "results/benchmarks/word2vec/{cell}.tsv"
    resources: gpu=job_gpus(lambda p: int(p["backend"] == "torch"))  # gensim, pretrained: CPU
    threads: cell_threads("threads")
    conda: LAB_ENV
    shell: STAGE_SHELL
