"""What the word2vec stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation


def report_figures(table, out_dir, folders):
    """Each seed's score per cell (dots) and the mean (bar): is a gap to gensim more than the
    seed-to-seed spread?"""
    from steps.word2vec.figures import seed_scores_figure  # report-side only (matplotlib)

    metric_columns = {ref.partition(".")[2]: title for title, ref in SHOWN.columns.items()}
    return seed_scores_figure(table, out_dir, folders, metric_columns)


# What a backend does not read of the word2vec section (its MLflow run leaves them out, so the
# compare view shows no optimizer for gensim and no training knobs for a pretrained model)
OURS_ONLY = ("optimizer", "schedule", "batch_size", "shared_negatives", "fused", "compile", "table_size",
             "chunk_words", "log_every", "vs_gensim_pairs", "vs_gensim_words")  # fmt: skip
TRAINING = ("threads", "arch", "dim", "window", "negative", "sample", "epochs", "lr", "min_lr", "seeds")
NOT_READ = {"torch": ("pretrained",), "gensim": ("pretrained", *OURS_ONLY), "pretrained": (*OURS_ONLY, *TRAINING)}


def params_used(p: dict) -> dict:
    return {k: v for k, v in p.items() if k not in NOT_READ[p["backend"]]}


SHOWN = Presentation(
    columns={
        "backend": "info.backend",
        "optimizer": "info.optimizer",
        "negatives": "info.negatives",
        "seeds": "metrics.seeds",
        "words/s": "metrics.words_per_s",
        # ours vs gensim interleaved in one job, equal threads (steps/word2vec/versus.py)
        "× gensim, side by side": "metrics.speed_vs_gensim",
        "× gensim 95 % interval": "info.speed_vs_gensim",
        "compile s (not in words/s)": "metrics.compile_s",
        # like with like: the questions every cell's vocabulary answers (steps/word2vec/questions.py)
        "analogy acc, common questions": "metrics.analogy_acc",
        "common questions": "metrics.analogy_n",
        "analogy acc, own questions": "metrics.analogy_full_acc",
        "own questions": "metrics.analogy_full_n",
        "WS353": "metrics.ws353_spearman",
        "SimLex": "metrics.simlex_spearman",
        "sd over seeds": "info.seed_sd",
        "king−man+woman top-5": "info.king_man_woman_top5",
    },
    # one job cannot know another's scores: the report compares with the gensim row
    derived={
        "analogy Δ gensim (common questions)": ("diff", "analogy acc, common questions", "gensim"),
        "WS353 Δ gensim": ("diff", "WS353", "gensim"),
        "SimLex Δ gensim": ("diff", "SimLex", "gensim"),
    },
    # With seeds > 1 the scores are means over seeds and words/s is their median: on the plays
    # one seed's WS353 moves by +-2-3 points (107 of its 353 pairs are in the vocabulary), more
    # than the 1-point margin the comparison with gensim is judged by.
    headline=("best Google-analogy accuracy, every cell on the same questions", "analogy acc, common questions", "max"),
    headline_of=("common questions", "questions every cell's vocabulary answers"),
    curves=["loss"],
    tables=["seeds"],  # each seed's scores, every trained cell (steps/word2vec/seeds.py)
    figures=report_figures,
    params_used=params_used,
)
