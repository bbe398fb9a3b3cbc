"""word2vec stage: one matrix cell = one way to get word vectors, all scored by one suite.

The stage is this package: `python -m steps.word2vec` (__main__.py) runs stage.py's `run`. The rest
is word2vec from scratch: vocabulary, subsampling, negative sampling, SGNS/CBOW in PyTorch, a gensim
baseline on the same tokens, pretrained-embedding loading, and one evaluation suite.
"""


def __getattr__(name):  # `STAGE` imports the stage (gensim, torch) only when asked for
    if name == "STAGE":
        from steps.word2vec.stage import STAGE

        return STAGE
    raise AttributeError(f"module 'steps.word2vec' has no attribute {name!r}")
