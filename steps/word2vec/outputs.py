"""What a word2vec cell leaves beside its metrics: the probe words' neighbours, the
king − man + woman quiz, the PCA plot of the word groups, and the exported vectors."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # before pyplot: jobs draw without a display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from steps.core import StageRun  # noqa: E402
from steps.word2vec.config import Word2VecConfig  # noqa: E402
from steps.word2vec.evaluate import pca_plot, save_word2vec_text  # noqa: E402


def log_outputs(ctx: StageRun, p: Word2VecConfig, kv, info: dict, words: list[str], vectors) -> None:
    """Tables and plot of the evaluated vectors (the first seed's); the vectors as text if
    `export`."""
    ctx.log_table(
        pd.DataFrame(
            [(w, " ".join(n)) for w, n in info["neighbours"].items()], columns=["probe", "nearest neighbours"]
        ),
        "neighbours",
    )
    ctx.log_table(pd.DataFrame(info.get("king_man_woman", []), columns=["word", "cosine"]), "king_man_woman")
    fig = pca_plot(kv, p.groups, f"word2vec[{ctx.cell}]")
    ctx.log_figure(fig, "pca_groups")
    plt.close(fig)
    if p.export:
        path = save_word2vec_text(ctx.out / "vectors.txt", words, vectors)
        ctx.info["vectors"] = str(path)
        ctx.log_artifact(path)
