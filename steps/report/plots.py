"""Learning curves per stage: each cell's history of the stage's `curves` metrics from MLflow."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd

from steps.tracking import store

matplotlib.use("Agg")  # the report draws to files, never to a display
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend


def curve_figure(stage: str, table: pd.DataFrame, keys: list[str], client, out: Path) -> Path | None:
    ok = table[(table["status"] == "ok") & (table["run_id"] != "")]
    if ok.empty or not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.5), squeeze=False)
    drawn = False
    for ax, key in zip(axes[0], keys):
        for _, row in ok.iterrows():
            hist = store.retrying(client.get_metric_history, row["run_id"], key)
            if len(hist) > 1:
                hist = sorted(hist, key=lambda m: m.step)
                ax.plot([m.step for m in hist], [m.value for m in hist], label=row["cell"])
                drawn = True
        ax.set_title(f"{stage}: {key}")
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return None
    path = out / f"{stage}_curves.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
