# word2vec: SGNS in PyTorch (optimizer cells), gensim on the same tokens, pretrained LM embeddings.

def word2vec_input(wildcards):
    """Trained cells read the corpus; pretrained-embedding cells need nothing from the DAG."""
    p = cell_config(config, "word2vec", wildcards.cell)["params"]
    return [] if p["backend"] == "pretrained" else [p["corpus"]]


rule word2vec:
    input: word2vec_input
    output: metrics="results/word2vec/{cell}/metrics.json"
    params: cfg=job_config(register("word2vec"))
    log: "results/logs/word2vec/{cell}.log"
    benchmark: "results/benchmarks/word2vec/{cell}.tsv"
    resources: gpu=job_gpus("word2vec")
    threads: lambda wildcards: cell_config(config, "word2vec", wildcards.cell)["params"]["threads"] or config["threads"]
    shell: STAGE_SHELL
