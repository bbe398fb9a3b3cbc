# word2vec: SGNS in PyTorch (optimizer cells), gensim on the same tokens, pretrained LM embeddings.

rule word2vec:
    input:
        # Trained cells read a corpus (word2vec.corpus, else prepare_corpus's); pretrained-embedding
        # cells read it only for its vocabulary, when their common analogy questions include it.
        unpack(lambda wildcards: {}
               if (p := cell_params("word2vec", wildcards))["backend"] == "pretrained"
               and "corpus" not in p["common_questions"]
               else {"corpus": p["corpus"] or rules.prepare_corpus.output.data}),
    output: metrics="results/word2vec/{cell}/metrics.json"
    params: **stage_params("steps.word2vec")
    log: "results/logs/word2vec/{cell}.log"
    benchmark: "results/benchmarks/word2vec/{cell}.tsv"
    resources: gpu=job_gpus(lambda p: int(p["backend"] == "torch"))  # gensim, pretrained: CPU
    threads: cell_threads("threads")
    conda: LAB_ENV
    shell: STAGE_SHELL
