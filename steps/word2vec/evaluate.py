"""One evaluation suite for every cell (ours, gensim, pretrained): gensim's analogy and
word-pair scorers on a KeyedVectors, the king - man + woman quiz, probe neighbours, PCA plot,
and the word2vec text-format export."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from gensim.models import KeyedVectors
from gensim.test.utils import datapath

matplotlib.use("Agg")  # jobs draw to files, never to a display
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from steps.word2vec.questions import Question, QuestionSet, read_questions  # noqa: E402

ANALOGIES, WS353, SIMLEX = "questions-words.txt", "wordsim353.tsv", "simlex999.txt"


def keyed_vectors(words: list[str], vectors: np.ndarray):
    kv = KeyedVectors(vector_size=vectors.shape[1], dtype=np.float32)
    kv.add_vectors(words, vectors.astype(np.float32))
    return kv


def score_analogies(kv, questions: list[Question], restrict_vocab: int, chunk: int = 1024) -> dict:
    """Google analogies a:b :: c:? by 3CosAdd, all questions of a chunk in one matmul.

    Same rule as gensim's `evaluate_word_analogies(case_insensitive=True)`: only questions whose
    four words are among the first `restrict_vocab` words count; the answer is the nearest
    unit vector to b̂ + ĉ - â other than a, b, c. gensim loops over questions in Python (a
    minute for a 20 k-word pretrained vocabulary); tests check both agree. Returns `correct`
    and `sections` of the answerable questions, in file order."""
    words = kv.index_to_key[:restrict_vocab]
    index = {}
    for i, w in enumerate(words):
        index.setdefault(w.lower(), i)  # the most frequent casing wins, as in gensim
    unit = kv.get_normed_vectors()[: len(words)]
    rows = [(q[0], *(index[w] for w in q[1:])) for q in questions if all(w in index for w in q[1:])]
    if not rows:
        return {"correct": np.zeros(0, bool), "sections": []}
    sections = [r[0] for r in rows]
    a, b, c, d = (np.array([r[k] for r in rows]) for k in range(1, 5))
    correct = np.zeros(len(rows), dtype=bool)
    for s in range(0, len(rows), chunk):
        sl = slice(s, s + chunk)
        scores = (unit[b[sl]] + unit[c[sl]] - unit[a[sl]]) @ unit.T
        r = np.arange(scores.shape[0])
        for banned in (a[sl], b[sl], c[sl]):
            scores[r, banned] = -np.inf
        correct[sl] = scores.argmax(1) == d[sl]
    return {"correct": correct, "sections": sections}


def analogies(kv, path: str, restrict_vocab: int) -> dict:
    """`score_analogies` on every question of a file; `total` = the questions in it."""
    questions = read_questions(path)
    return {**score_analogies(kv, questions, restrict_vocab), "total": len(questions)}


def analogy_metrics(res: dict, prefix: str) -> dict:
    """Accuracy over the scored questions (and their semantic / syntactic halves) and their count."""
    ok, syntactic = res["correct"], np.array([s.startswith("gram") for s in res["sections"]], bool)

    def acc(mask) -> float:
        return float(ok[mask].mean()) if mask.any() else float("nan")

    return {
        f"{prefix}_acc": acc(np.ones(len(ok), bool)),
        f"{prefix}_n": len(ok),
        f"{prefix}_semantic_acc": acc(~syntactic),
        f"{prefix}_syntactic_acc": acc(syntactic),
    }


def pairs_in_vocab(kv, path: str) -> float:
    rows = [line.lower().split("\t")[:2] for line in open(path) if not line.startswith("#")]
    return sum(a in kv and b in kv for a, b in rows) / len(rows)


def evaluate(
    kv, restrict_vocab: int, probes: list[str], topn: int = 10, common: QuestionSet | None = None
) -> tuple[dict, dict]:
    """Returns (metrics, info). Two analogy accuracies, each over the questions whose four words
    are in the first `restrict_vocab` words (gensim's rule):
    - `analogy_acc` / `analogy_n`: on `common`, the questions that every
      compared cell can answer: the number cells are compared by;
    - `analogy_full_acc` / `analogy_full_n`: on all the questions this vocabulary answers
      (`analogy_coverage` of the file's).
    Similarity OOV pairs are skipped and reported as a rate."""
    questions = read_questions(datapath(ANALOGIES))
    full = score_analogies(kv, questions, restrict_vocab)
    m = analogy_metrics(full, "analogy_full")
    m["analogy_coverage"] = len(full["correct"]) / len(questions)
    if common is None:
        m |= analogy_metrics(full, "analogy")
    else:
        res = score_analogies(kv, list(common.questions), restrict_vocab)
        if len(res["correct"]) != len(common.questions):
            raise RuntimeError(
                f"{len(common.questions) - len(res['correct'])} of the {common.label} are not answerable within "
                f"this cell's first {restrict_vocab} words; fix: raise word2vec.restrict_vocab"
            )
        m |= analogy_metrics(res, "analogy")
    m |= {"restrict_vocab": restrict_vocab, "vocab_size": len(kv)}
    for key, name in (("ws353", WS353), ("simlex", SIMLEX)):
        try:
            _, spearman, oov = kv.evaluate_word_pairs(
                datapath(name), restrict_vocab=restrict_vocab, case_insensitive=True
            )
        except ValueError:  # fewer than 2 pairs in vocabulary: no correlation to compute
            spearman, oov = (float("nan"),), 100.0 * (1 - pairs_in_vocab(kv, datapath(name)))
        m[f"{key}_spearman"] = float(spearman[0])
        m[f"{key}_oov"] = oov / 100.0
    info = {}
    if all(w in kv for w in ("king", "man", "woman")):
        top = kv.most_similar(positive=["king", "woman"], negative=["man"], topn=topn)
        info["king_man_woman"] = [[w, round(float(s), 4)] for w, s in top]
        info["king_man_woman_top5"] = ", ".join(w for w, _ in top[:5])
        m["king_man_woman_queen_rank"] = next((i + 1 for i, (w, _) in enumerate(top) if w == "queen"), float("nan"))
    else:
        info["king_man_woman_top5"] = "(king/man/woman not in vocabulary)"
    info["neighbours"] = {p: [w for w, _ in kv.most_similar(p, topn=8)] for p in probes if p in kv}
    return m, info


def pca_plot(kv, groups: dict[str, list[str]], title: str):
    """2-D PCA of the chosen word groups (unit-normalised vectors): do related words cluster?"""
    rows = [(g, w) for g, ws in groups.items() for w in ws if w in kv]
    fig, ax = plt.subplots(figsize=(7, 6))
    if len(rows) >= 3:
        x = np.stack([kv.get_vector(w, norm=True) for _, w in rows])
        x = x - x.mean(0)
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        xy = x @ vt[:2].T
        for k, g in enumerate(groups):
            sel = [i for i, (gg, _) in enumerate(rows) if gg == g]
            ax.scatter(xy[sel, 0], xy[sel, 1], label=g, color=f"C{k}")
            for i in sel:
                ax.annotate(rows[i][1], xy[i], fontsize=8, xytext=(3, 2), textcoords="offset points")
        ax.legend(fontsize=8)
    ax.set_title(f"{title}: PCA of word groups ({len(rows)} words in vocabulary)")
    ax.set_xlabel("PC1")
    ax.set_ylabel("PC2")
    fig.tight_layout()
    return fig


def save_word2vec_text(path: str | Path, words: list[str], vectors: np.ndarray) -> Path:
    """word2vec's text format: a 'count dim' header, then 'word v1 ... vd' per line."""
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{len(words)} {vectors.shape[1]}\n")
        for w, v in zip(words, vectors):
            if not w or any(c.isspace() for c in w):
                raise ValueError(f"word {w!r} cannot be written in word2vec text format")
            f.write(w + " " + " ".join(f"{x:.6g}" for x in v.tolist()) + "\n")
    return path
