"""word2vec from scratch: vocabulary, subsampling, negative sampling, SGNS/CBOW in PyTorch,
a gensim baseline on the same tokens, pretrained-embedding loading, and one evaluation suite."""
