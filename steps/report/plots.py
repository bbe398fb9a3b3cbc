"""Learning curves per stage: each cell's history of the stage's `curves` metrics from MLflow."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd

from steps.tracking import store

matplotlib.use("Agg")  # the report draws to files, never to a display
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

WARM_UP = 1  # leading steps of a timing curve left out: the first step compiles (torch.compile) and warms caches
WARM_UP_NOTE = "\n(first step left out: warm-up, compile)"
STYLES = ("-", "--", ":", "-.")


def line_style(i: int) -> dict:
    """The i-th cell's colour and dash: tab20's dark shades, then its light ones (20 colours that
    stay apart), then the same colours dashed, so 16 or more cells never share a line."""
    colors = plt.get_cmap("tab20").colors
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return {"color": colors[order[i % 20]], "linestyle": STYLES[(i // 20) % len(STYLES)]}


def is_timing(key: str) -> bool:
    """Per-step wall time (step_time_ms, ...): its first steps are warm-up, not the cell's speed."""
    return "time" in key


def points(client, run_id: str, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a run's metric history as plotted: a timing curve without its warm-up."""
    hist = sorted(store.retrying(client.get_metric_history, run_id, key), key=lambda m: m.step)
    hist = hist[WARM_UP:] if is_timing(key) else hist
    return [m.step for m in hist], [m.value for m in hist]


def curve_figure(stage: str, table: pd.DataFrame, keys: list[str], client, out: Path) -> Path | None:
    """Each ok cell's history of `keys`, one panel per key, one legend for the figure; timing panels
    leave out the first WARM_UP steps (their title says so)."""
    ok = table[(table["status"] == "ok") & (table["run_id"] != "")]
    if ok.empty or not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.5), squeeze=False)
    labels: dict[str, object] = {}
    for ax, key in zip(axes[0], keys):
        for i, (_, row) in enumerate(ok.iterrows()):
            steps, values = points(client, row["run_id"], key)
            if len(steps) > 1:
                (line,) = ax.plot(steps, values, **line_style(i))
                labels.setdefault(row["cell"], line)
        ax.set_title(f"{stage}: {key}" + (WARM_UP_NOTE if is_timing(key) else ""))
        ax.set_xlabel("step")
    if not labels:
        plt.close(fig)
        return None
    fig.legend(labels.values(), labels.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    path = out / f"{stage}_curves.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
