"""Training a word2vec cell's vectors: one seed with the cell's backend (our trainer or gensim on
the same tokens), and the cell's further seeds: one seed's scores move more than the margin the
comparison with gensim is judged by (see steps/word2vec/stage.py), so the scores become means over
seeds, words/s their median."""

from __future__ import annotations

import pandas as pd
import torch

from steps.core import StageRun
from steps.core.seeds import interval
from steps.word2vec.baseline import train_gensim
from steps.word2vec.config import Word2VecConfig
from steps.word2vec.corpus import Corpus
from steps.word2vec.evaluate import evaluate, keyed_vectors
from steps.word2vec.questions import QuestionSet
from steps.word2vec.train import TrainConfig, train

QUALITY = ("analogy_acc", "analogy_full_acc", "ws353_spearman", "simlex_spearman")


def train_vectors(ctx: StageRun, p: Word2VecConfig, corpus: Corpus, seed: int) -> tuple[list[str], "object", dict]:
    """Train (torch or gensim) on the corpus; returns (words, vectors, metrics). Only the job's
    own seed logs its loss curve (it is the seed whose vectors are exported)."""
    cfg = TrainConfig.from_params(p, seed=seed)
    device = ctx.device if p.backend == "torch" else None  # SkipCell if CUDA is absent
    threads = p.threads or ctx.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    m = {**corpus.metrics, "threads": threads}
    if p.backend == "gensim":
        kv, stats = train_gensim(corpus.sentences, cfg, p.min_count, workers=threads)
        if threads > 1:  # hogwild threads race on shared rows: runs differ in the last digits
            ctx.info["determinism"] = f"gensim with {threads} workers is not bit-reproducible"
        if set(kv.index_to_key) != set(corpus.vocab.words):
            raise RuntimeError("gensim built a different vocabulary from the same tokens")
        words, vectors = list(kv.index_to_key), kv.vectors
    else:
        vectors, stats = train(
            corpus.vocab,
            corpus.ids,
            corpus.sid,
            corpus.metrics["corpus_words"],
            cfg,
            device=device,
            progress=ctx.progress,
            log=ctx.log_metrics if seed == ctx.seed else None,
        )
        words = corpus.vocab.words
    return words, vectors, {**m, **stats}


def over_seeds(ctx: StageRun, p: Word2VecConfig, corpus: Corpus, first: dict, common: QuestionSet) -> dict:
    """Train and score seeds seed+1 .. seed+seeds-1 as well; scores become means over all
    seeds (analogy_acc on the cell's `common` questions), words/s their median, and each score's
    sample sd and 95 % interval (Student's t over seeds) are reported beside them. Each
    seed's scores are a child run of the cell's run (and a row of its seeds table)."""
    if p.seeds == 1:
        return {"seeds": 1}
    rows = [{"seed": ctx.seed, "words_per_s": first["words_per_s"], **{k: first[k] for k in QUALITY}}]
    for i in range(1, p.seeds):
        words, vectors, m = train_vectors(ctx, p, corpus, ctx.seed + i)
        scores, _ = evaluate(keyed_vectors(words, vectors), p.restrict_vocab, [], common=common)
        rows.append({"seed": ctx.seed + i, "words_per_s": m["words_per_s"], **{k: scores[k] for k in QUALITY}})
    for row in rows:  # one finished child run per seed, nested under the cell's run
        ctx.log_child(
            f"word2vec:{ctx.cell} seed {row['seed']}",
            params={"seed": row["seed"], "backend": p.backend},
            metrics={k: row[k] for k in ("words_per_s", *QUALITY)},
            tags={"seed": str(row["seed"])},
        )
    table = pd.DataFrame(rows)
    ctx.log_table(table, "seeds")
    out = {
        "seeds": len(rows),
        "words_per_s": float(table["words_per_s"].median()),
        "first_seed_words_per_s": first["words_per_s"],
    }
    for k in QUALITY:  # the cell's score: the mean over seeds with its 95 % interval (steps/core/seeds.py)
        scored = table[k].dropna().tolist()  # a score no seed could give (too few pairs in the vocabulary): NaN
        if not scored:
            out |= {k: float("nan"), f"first_seed_{k}": first[k]}
            continue
        iv = interval(scored)
        out |= {k: iv.mean, f"first_seed_{k}": first[k], f"{k}_sd": iv.sd, f"{k}_low": iv.low, f"{k}_high": iv.high}
    ctx.info["seed_sd"] = ", ".join(
        f"{name} {_or_nan(out.get(f'{k}_sd')):.3f}"
        for name, k in zip(("analogy", "analogy (own)", "WS353", "SimLex"), QUALITY)
    )
    return out


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value
