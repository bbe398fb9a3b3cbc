"""gensim's Word2Vec on exactly our tokens and hyperparameters, timed like our trainer."""

from __future__ import annotations

import time
import zlib

from gensim.models import Word2Vec

from steps.word2vec.train import TrainConfig


def stable_hash(text: str) -> int:
    """gensim's `hashfxn` (default: Python's str hash, which changes per process with
    PYTHONHASHSEED). gensim 4 draws the initial vectors from one generator seeded by `seed`
    (U(-1/d, 1/d), which our SGNS matches) and uses hashfxn only for per-word seeded vectors;
    crc32 keeps any such path reproducible too."""
    return zlib.crc32(text.encode("utf-8"))


def gensim_model(sentences: list[list[str]], cfg: TrainConfig, min_count: int, workers: int) -> Word2Vec:
    """gensim's Word2Vec with our hyperparameters, its vocabulary built from `sentences`
    (untrained; building is not timed, for either trainer)."""
    model = Word2Vec(
        vector_size=cfg.dim,
        window=cfg.window,
        negative=cfg.negative,
        hs=0,
        sample=cfg.sample,
        min_count=min_count,
        sg=int(cfg.arch == "skipgram"),
        cbow_mean=1,
        alpha=cfg.lr,
        min_alpha=cfg.min_lr,
        epochs=cfg.epochs,
        workers=workers,
        seed=cfg.seed,
        hashfxn=stable_hash,
        ns_exponent=0.75,
    )
    model.build_vocab(sentences)
    return model


def train_gensim(sentences: list[list[str]], cfg: TrainConfig, min_count: int, workers: int):
    """Returns (KeyedVectors, stats). Only `train()` is timed; words/s = raw corpus words x
    epochs / train seconds, the same count ours uses."""
    model = gensim_model(sentences, cfg, min_count, workers)
    t0, c0 = time.perf_counter(), time.process_time()
    trained, raw = model.train(sentences, total_examples=model.corpus_count, epochs=cfg.epochs)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = {
        "train_seconds": seconds,
        "words_per_s": raw / seconds,
        "train_cpu_s": cpu,
        "words_per_cpu_s": raw / cpu,
        "effective_words": trained,
        "raw_words": raw,
    }
    return model.wv, stats
