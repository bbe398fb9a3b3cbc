"""word2vec stage: one matrix cell = one way to get word vectors, all scored by one suite.

backend torch     -> our skip-gram/CBOW with negative sampling (steps/w2v), optimizer per cell
backend gensim    -> gensim Word2Vec on the same tokens and hyperparameters, timed the same way
backend pretrained-> a pretrained LM's input embeddings (single-token words only)
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from steps.stage import Stage
from steps.tracking import InputError, StageRun

# With seeds > 1 the scores above are means over seeds and words/s is their median: on the plays
# one seed's WS353 moves by +-2-3 points (107 of its 353 pairs are in the vocabulary), more than
# the 1-point margin the comparison with gensim is judged by.
QUALITY = ("analogy_acc", "ws353_spearman", "simlex_spearman")


def report_figures(table, out_dir, folders):
    """Each seed's score per cell (dots) and the mean (bar): is a gap to gensim more than the
    seed-to-seed spread?"""
    from pathlib import Path

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    trained = table[(table["status"] == "ok") & table["backend"].isin(["torch", "gensim"])]
    if trained.empty:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key, title in zip(axes, QUALITY, ("Google analogy accuracy", "WS353 Spearman", "SimLex Spearman")):
        for x, (cell, row) in enumerate(trained.set_index("cell").iterrows()):
            seeds = folders[cell] / "seeds.csv"
            column = next(t for t, ref in STAGE.columns.items() if ref == f"metrics.{key}")
            values = pd.read_csv(seeds)[key] if seeds.exists() else pd.Series([row[column]])
            ax.bar(x, values.mean(), color="tab:orange" if row["backend"] == "gensim" else "tab:blue", alpha=0.4)
            ax.scatter([x] * len(values), values, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(trained)), trained["cell"], rotation=30, ha="right")
        ax.set_title(title, fontsize=10)
    fig.suptitle("word2vec: score per seed (dots) and mean (bar); gensim in orange")
    fig.tight_layout()
    path = Path(out_dir) / "word2vec_seeds.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path]


def load_sentences(p: dict, path: str) -> tuple[list[list[str]], int]:
    """Tokenised documents of the corpus split (shared tokenizer), cut to max_words if set."""
    from datasets import load_from_disk

    from steps.w2v.text import sentences

    try:
        ds = load_from_disk(path)
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no dataset saved there ({exc}); fix: run the prepare_corpus "
                         f"rule first or set word2vec.corpus") from None
    if p["split"] not in ds or "text" not in ds[p["split"]].column_names:
        raise InputError(f"{path}: needs split {p['split']!r} with a 'text' column; "
                         f"found {dict(ds.column_names)}; fix: set word2vec.split")
    sents = sentences(ds[p["split"]]["text"])
    if p["max_words"]:
        kept, n = [], 0
        for s in sents:
            if n >= p["max_words"]:
                break
            kept.append(s[: p["max_words"] - n])
            n += len(kept[-1])
        sents = kept
    words = sum(map(len, sents))
    if not words:
        raise InputError(f"{path}[{p['split']}]: no words after tokenising; fix: check the corpus")
    return sents, words


@dataclass
class Corpus:
    """The tokens every seed of a cell trains on, read and encoded once per job."""
    sentences: list[list[str]]
    vocab: "object"
    ids: "object"
    sid: "object"
    metrics: dict


def encode_corpus(ctx: StageRun, p: dict) -> Corpus:
    """A bad config, or a CUDA cell without CUDA (SkipCell), stops before the corpus is read."""
    from steps.w2v.train import TrainConfig
    from steps.w2v.vocab import Vocab

    TrainConfig.from_params(p)
    if p["backend"] == "torch":
        ctx.device  # noqa: B018 - the property raises SkipCell
    sents, raw = load_sentences(p, ctx.inputs["corpus"])
    t0 = time.perf_counter()
    vocab = Vocab.build(sents, p["min_count"])
    ids, sid = vocab.encode(sents)
    return Corpus(sents, vocab, ids, sid, {"corpus_words": raw, "vocab_build_s": time.perf_counter() - t0})


def train_vectors(ctx: StageRun, p: dict, corpus: Corpus, seed: int) -> tuple[list[str], "object", dict]:
    """Train (torch or gensim) on the corpus; returns (words, vectors, metrics). Only the job's
    own seed logs its loss curve (it is the seed whose vectors are exported)."""
    import torch

    from steps.w2v.baseline import train_gensim
    from steps.w2v.train import TrainConfig, train

    cfg = TrainConfig.from_params(p, seed=seed)
    device = ctx.device if p["backend"] == "torch" else None  # SkipCell if CUDA is absent
    threads = p["threads"] or ctx.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    m = {**corpus.metrics, "threads": threads}
    if p["backend"] == "gensim":
        kv, stats = train_gensim(corpus.sentences, cfg, p["min_count"], workers=threads)
        if threads > 1:  # hogwild threads race on shared rows: runs differ in the last digits
            ctx.info["determinism"] = f"gensim with {threads} workers is not bit-reproducible"
        if set(kv.index_to_key) != set(corpus.vocab.words):
            raise RuntimeError("gensim built a different vocabulary from the same tokens")
        words, vectors = list(kv.index_to_key), kv.vectors
    else:
        vectors, stats = train(corpus.vocab, corpus.ids, corpus.sid, corpus.metrics["corpus_words"], cfg,
                               device=device, progress=ctx.progress,
                               log=ctx.log_metrics if seed == ctx.seed else None)
        words = corpus.vocab.words
    return words, vectors, {**m, **stats}


def over_seeds(ctx: StageRun, p: dict, corpus: Corpus, first: dict) -> dict:
    """Train and score seeds seed+1 .. seed+seeds-1 as well; scores become means over all
    seeds (each also logged per seed, step = seed index), words/s their median, and the
    sample sd of each score is reported beside them."""
    import pandas as pd

    from steps.w2v.evaluate import evaluate, keyed_vectors

    if p["seeds"] == 1:
        return {"seeds": 1}
    rows = [{"seed": ctx.seed, "words_per_s": first["words_per_s"], **{k: first[k] for k in QUALITY}}]
    for i in range(1, p["seeds"]):
        words, vectors, m = train_vectors(ctx, p, corpus, ctx.seed + i)
        scores, _ = evaluate(keyed_vectors(words, vectors), p["restrict_vocab"], [])
        rows.append({"seed": ctx.seed + i, "words_per_s": m["words_per_s"], **{k: scores[k] for k in QUALITY}})
    for i, row in enumerate(rows):
        ctx.log_metrics({f"seed_{k}": row[k] for k in ("words_per_s", *QUALITY)}, step=i)
    table = pd.DataFrame(rows)
    ctx.log_table(table, "seeds")
    out = {"seeds": len(rows), "words_per_s": float(table["words_per_s"].median()),
           "first_seed_words_per_s": first["words_per_s"]}
    for k in QUALITY:
        out |= {k: float(table[k].mean()), f"first_seed_{k}": first[k], f"{k}_sd": float(table[k].std())}
    ctx.info["seed_sd"] = ", ".join(f"{name} {out[f'{k}_sd']:.3f}" for name, k in
                                    zip(("analogy", "WS353", "SimLex"), QUALITY))
    return out


def run(ctx: StageRun) -> dict:
    from steps.w2v.evaluate import evaluate, keyed_vectors, pca_plot, save_word2vec_text

    p = ctx.params
    ctx.info.update(backend=p["backend"], arch=p["arch"],
                    optimizer=p["optimizer"] if p["backend"] == "torch" else p["backend"])
    t0 = time.perf_counter()
    if p["backend"] == "pretrained":
        from steps.w2v.pretrained import load_pretrained

        words, vectors, info = load_pretrained(p["pretrained"])
        ctx.info.update(info, optimizer="pretrained:" + p["pretrained"])
        metrics = {"load_s": time.perf_counter() - t0}
    else:
        if p["backend"] == "torch":
            ctx.info["update_path"] = (("torch.compile'd" if p["compile"] else "eager")
                                       + " hand-written index_add_ SGD" if p["fused"]
                                       else "autograd sparse grads")
            ctx.info["negatives"] = "shared per window" if p["shared_negatives"] else "per pair"
            ctx.info["timing"] = "words/s over the training loop; compile_s (one-time, cached on " \
                                 "disk by Inductor) is excluded, as gensim's build is"
        corpus = encode_corpus(ctx, p)
        words, vectors, metrics = train_vectors(ctx, p, corpus, ctx.seed)
    kv = keyed_vectors(words, vectors)
    t1 = time.perf_counter()
    scores, info = evaluate(kv, p["restrict_vocab"], p["probes"])
    metrics.update(scores, eval_s=time.perf_counter() - t1)
    ctx.info.update(info)
    if p["backend"] != "pretrained":  # the first seed's vectors are the ones exported and plotted
        metrics.update(over_seeds(ctx, p, corpus, metrics))
    import pandas as pd

    ctx.log_table(pd.DataFrame([(w, " ".join(n)) for w, n in info["neighbours"].items()],
                               columns=["probe", "nearest neighbours"]), "neighbours")
    ctx.log_table(pd.DataFrame(info.get("king_man_woman", []), columns=["word", "cosine"]),
                  "king_man_woman")
    import matplotlib.pyplot as plt

    fig = pca_plot(kv, p["groups"], f"word2vec[{ctx.cell}]")
    ctx.log_figure(fig, "pca_groups")
    plt.close(fig)
    if p["export"]:
        path = save_word2vec_text(ctx.out / "vectors.txt", words, vectors)
        ctx.info["vectors"] = str(path)
        ctx.log_artifact(path)
    return metrics


STAGE = Stage(
    __spec__.name, run,
    columns={
        "backend": "info.backend",
        "optimizer": "info.optimizer",
        "seeds": "metrics.seeds",
        "words/s": "metrics.words_per_s",
        "analogy acc": "metrics.analogy_acc",
        "analogy n": "metrics.analogy_n",
        "WS353": "metrics.ws353_spearman",
        "SimLex": "metrics.simlex_spearman",
        "sd over seeds": "info.seed_sd",
        "king−man+woman top-5": "info.king_man_woman_top5",
    },
    # one job cannot know another's speed or scores: the report compares with the gensim row
    derived={"ratio to gensim": ("ratio", "words/s", "gensim"),
             "analogy Δ gensim": ("diff", "analogy acc", "gensim"),
             "WS353 Δ gensim": ("diff", "WS353", "gensim"),
             "SimLex Δ gensim": ("diff", "SimLex", "gensim")},
    headline=("best Google-analogy accuracy", "analogy acc", "max"),
    curves=["loss"],
    figures=report_figures,
)

if __name__ == "__main__":
    STAGE.main()
