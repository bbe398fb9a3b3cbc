"""The word2vec section's report figure: each seed's score per cell (dots) and the mean (bar),
so a gap to gensim can be read against the seed-to-seed spread."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: the report draws without a display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

PLOTTED = {  # score -> panel title (each a column of steps/word2vec/seeds.py's seeds table)
    "analogy_acc": "analogy accuracy (common questions)",
    "ws353_spearman": "WS353 Spearman",
    "simlex_spearman": "SimLex Spearman",
}


def seed_scores_figure(table: pd.DataFrame, out_dir, folders: dict, columns: dict[str, str]) -> list[Path]:
    """`table` is the report's word2vec table, `folders` each cell's output folder; `columns` maps
    a score's metric key to its column title there (the fallback when a cell has no seeds.csv)."""
    trained = table[(table["status"] == "ok") & table["backend"].isin(["torch", "gensim"])]
    if trained.empty:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (key, title) in zip(axes, PLOTTED.items()):
        for x, (cell, row) in enumerate(trained.set_index("cell").iterrows()):
            seeds = Path(folders[cell]) / "seeds.csv"
            values = pd.read_csv(seeds)[key] if seeds.exists() else pd.Series([row[columns[key]]])
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
