"""word2vec stage: one matrix cell = one way to get word vectors, all scored by one suite.

backend torch     -> our skip-gram/CBOW with negative sampling (steps/word2vec), optimizer per cell
backend gensim    -> gensim Word2Vec on the same tokens and hyperparameters, timed the same way
backend pretrained-> a pretrained LM's input embeddings (single-token words only)

Skip-gram negatives: `shared_negatives: true` draws K negatives once per window and shares them
among the window's pairs (pWord2Vec, Ji et al. 2016: fewer rows gathered, same expected gradient);
false draws K for every (context, center) pair, as word2vec.c and gensim do. The default matrix
runs both (sgd, sgd_perpair), each timed against gensim side by side in its own job
(speed_vs_gensim, steps/word2vec/versus.py), and every cell is scored on the analogy questions that all
cells' vocabularies answer (analogy_acc, steps/word2vec/questions.py) beside its own coverage.
"""

from __future__ import annotations

import time

from gensim.test.utils import datapath

from steps.core import Stage, StageRun
from steps.presentation.word2vec import SHOWN
from steps.word2vec.config import Word2VecConfig
from steps.word2vec.corpus import encode_corpus
from steps.word2vec.evaluate import ANALOGIES, evaluate, keyed_vectors
from steps.word2vec.outputs import log_outputs
from steps.word2vec.pretrained import load_pretrained
from steps.word2vec.questions import CORPUS, check_sources, question_set, read_questions
from steps.word2vec.seeds import over_seeds, train_vectors
from steps.word2vec.versus import paired_metrics

NEGATIVES = {
    True: "shared per window (pWord2Vec: one draw of K for all the window's pairs)",
    False: "per pair (word2vec.c: a fresh draw of K for every pair)",
}


def run(ctx: StageRun) -> dict:
    p = Word2VecConfig.of(ctx.params)
    ctx.info.update(backend=p.backend, arch=p.arch, optimizer=p.optimizer if p.backend == "torch" else p.backend)
    check_sources(p)  # a bad common_questions list stops before any work
    t0 = time.perf_counter()
    pretrained = p.backend == "pretrained"
    if pretrained:
        words, vectors, info = load_pretrained(p.pretrained)
        ctx.info.update(info, optimizer="pretrained:" + p.pretrained, negatives="(pretrained)")
        metrics = {"load_s": time.perf_counter() - t0}
        corpus = encode_corpus(ctx, p) if CORPUS in p.common_questions else None
        known = {p.pretrained: words}
    else:
        corpus, known = encode_corpus(ctx, p), {}
        describe_trainer(ctx, p)
    common = question_set(p, read_questions(datapath(ANALOGIES)), corpus and corpus.vocab.words, known)
    ctx.info.update(analogy_questions=common.label, analogy_questions_digest=common.digest)
    if not pretrained:
        words, vectors, metrics = train_vectors(ctx, p, corpus, ctx.seed)
    kv = keyed_vectors(words, vectors)
    t1 = time.perf_counter()
    scores, info = evaluate(kv, p.restrict_vocab, p.probes, common=common)
    metrics.update(scores, eval_s=time.perf_counter() - t1)
    ctx.info.update(info)
    if not pretrained:  # the first seed's vectors are the ones exported and plotted
        metrics.update(over_seeds(ctx, p, corpus, metrics, common))
    if not pretrained:
        ctx.info.setdefault("seed_sd", "(1 seed)")
    if p.backend == "torch" and p.vs_gensim_pairs:
        metrics.update(paired_metrics(ctx, p, corpus))
    elif p.backend == "gensim":  # the reference of the paired ratios: 1 by definition
        metrics.update(speed_vs_gensim=1.0, compile_s=0.0)  # gensim's C loops are built at install
        ctx.info["speed_vs_gensim"] = "1 (the reference)"
    log_outputs(ctx, p, kv, info, words, vectors)
    return metrics


def describe_trainer(ctx: StageRun, p: Word2VecConfig) -> None:
    """What the cell's trainer does, for the report's columns."""
    if p.backend == "gensim":
        ctx.info["negatives"] = "per pair (gensim's C loop, as word2vec.c)"
        return
    ctx.info["update_path"] = (
        ("torch.compile'd" if p.compile else "eager") + " hand-written index_add_ SGD"
        if p.fused
        else "autograd sparse grads"
    )
    ctx.info["negatives"] = (
        "per window (CBOW: one example per window, as word2vec.c)"
        if p.arch == "cbow"
        else NEGATIVES[p.shared_negatives]
    )
    ctx.info["timing"] = (
        "words/s over the training loop; compile_s (one-time, cached on disk by Inductor) is excluded, "
        "as gensim's vocabulary build is; speed_vs_gensim: interleaved slices, ours vs gensim.train"
    )


STAGE = Stage.of("steps.word2vec", run, SHOWN, own_seeds=True)  # a package stage: its name is the package's;
# its further seeds only train and score (steps/word2vec/seeds.py), never export
