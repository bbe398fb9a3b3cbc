"""Ours vs gensim, side by side in one process: the cell's trainer and gensim's `Word2Vec.train`
take turns on the same slices of the corpus (A B / B A, steps/paired.py), at the same threads and
hyperparameters, and the speed ratio comes with its 95 % interval over the pairs.

A ratio of two words/s taken in separate jobs, minutes apart, carries whatever else the machine
did meanwhile; here each pair runs back to back under the same load. Pair k trains slice k (a run
of whole sentences, ~`words` raw words) once with each trainer, so both count the same words and
the per-pair time ratio is the speed ratio. Both models are fresh (our trainer: its own seed and
RNG, set up and compiled before the first pair; gensim: vocabulary built from the whole corpus
first) and are thrown away after: the cell's own vectors and scores are untouched. The learning
rate decays linearly over the slices, from lr to min_lr, identically for both. The first
`warmup` pairs are untimed (gensim starts its threads, our first plan warms numpy's caches).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from steps.paired import Ratio, interleave, ratio_of_pairs
from steps.word2vec.baseline import gensim_model
from steps.word2vec.config import Word2VecConfig
from steps.word2vec.corpus import Corpus
from steps.word2vec.train import TrainConfig, Trainer


def cut_slices(lengths: Sequence[int], words: int, count: int) -> list[tuple[int, int]]:
    """`count` runs [s0, s1) of consecutive sentences, each the shortest reaching `words` raw
    words (the whole corpus if it is smaller), in text order; back to the top when the text
    runs out."""
    if words < 1 or count < 1:
        raise ValueError(f"need words >= 1 and count >= 1, got {words}, {count}")
    cum = np.concatenate([[0], np.cumsum(lengths)])
    words = min(words, int(cum[-1]))
    out, s = [], 0
    for _ in range(count):
        if cum[-1] - cum[s] < words:
            s = 0
        e = int(np.searchsorted(cum, cum[s] + words, side="left"))
        out.append((s, e))
        s = e
    return out


def speed_vs_gensim(
    corpus: Corpus,
    cfg: TrainConfig,
    min_count: int,
    threads: int,
    pairs: int,
    words: int,
    device="cpu",
    warmup: int = 1,
    progress=None,
) -> tuple[Ratio, dict, dict]:
    """How many times faster our trainer (cfg) is than gensim on the same slices, interleaved;
    returns (Ratio, the timed pairs {ours_s, gensim_s, ours_first}, metrics: the words each side
    trained in timed pairs, each side's words/s over them, the setup and compile seconds that were
    left out, the wall and CPU time of it all)."""
    t0, c0 = time.perf_counter(), time.process_time()
    torch.set_num_threads(threads)
    n = pairs + warmup
    cuts = cut_slices([len(s) for s in corpus.sentences], words, n)
    ours = Trainer(corpus.vocab, cfg, device)
    theirs = gensim_model(corpus.sentences, cfg, min_count, workers=threads)
    setup_s = time.perf_counter() - t0
    alpha = np.linspace(cfg.lr, cfg.min_lr, n + 1)  # slice k: alpha[k] -> alpha[k + 1]
    done = {"ours": 0, "gensim": 0}
    bar = progress(total=2 * n, desc="vs gensim (slices)") if progress else None

    def run_ours():
        k = done["ours"]
        s0, s1 = cuts[k]
        a, z = np.searchsorted(corpus.sid, [s0, s1])
        hi, lo = float(alpha[k]), float(alpha[k + 1])
        ours.train_range(corpus.ids[a:z], corpus.sid[a:z], lambda i, m: hi + (lo - hi) * i / m)
        done["ours"] += 1
        if bar is not None:
            bar.update(1)

    def run_gensim():
        k = done["gensim"]
        s0, s1 = cuts[k]
        theirs.train(
            corpus.sentences[s0:s1],
            total_examples=s1 - s0,
            epochs=1,
            start_alpha=float(alpha[k]),
            end_alpha=float(alpha[k + 1]),
        )
        done["gensim"] += 1
        if bar is not None:
            bar.update(1)

    sync = torch.cuda.synchronize if ours.device.type == "cuda" else None
    a_times, b_times = interleave(run_ours, run_gensim, pairs, warmup, sync=sync)
    if bar is not None:
        bar.close()
    timed = sum(sum(len(s) for s in corpus.sentences[s0:s1]) for s0, s1 in cuts[warmup:])
    times = {"ours_s": a_times, "gensim_s": b_times, "ours_first": [i % 2 == 0 for i in range(len(a_times))]}
    return (
        ratio_of_pairs(a_times, b_times),
        times,
        {
            "vs_gensim_words": timed,
            "vs_gensim_ours_words_per_s": timed / sum(a_times),
            "vs_gensim_gensim_words_per_s": timed / sum(b_times),
            "vs_gensim_setup_s": setup_s,
            "vs_gensim_compile_s": ours.compile_s,
            "vs_gensim_s": time.perf_counter() - t0,
            "vs_gensim_cpu_s": time.process_time() - c0,  # what the side-by-side timing costs the job
        },
    )


def paired_metrics(ctx, p: Word2VecConfig, corpus: Corpus) -> dict:
    """A torch cell's `speed_vs_gensim` (+ _low, _high, _pairs: steps/paired.Ratio.as_metrics)
    and the paired run's words/s; the interval in words goes to info."""
    cfg = TrainConfig.from_params(p, seed=ctx.seed)
    threads = p.threads or ctx.threads or torch.get_num_threads()
    ratio, times, m = speed_vs_gensim(
        corpus,
        cfg,
        p.min_count,
        threads,
        p.vs_gensim_pairs,
        p.vs_gensim_words,
        device=ctx.device,
        progress=ctx.progress,
    )
    ctx.info["speed_vs_gensim"] = (
        f"{ratio}: ours on {ctx.device} vs gensim on CPU, {threads} thread(s) each, "
        f"{m['vs_gensim_words']:,} words per side in timed pairs"
    )
    ctx.log_table(pd.DataFrame(times), "vs_gensim_pairs")  # the pairs the ratio is computed from
    return {**ratio.as_metrics("speed_vs_gensim"), **m}
