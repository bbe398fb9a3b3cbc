"""The scale section's plots: memory per GPU and predicted tokens/s per GPU against world size,
one series per (model, strategy: the plan without its sizes, cluster, batch per rank), from the
report's table of the stage's cells. Colour = model; marker and line style = the series among those
of its colour (the most distinct markers first), so no colour and marker pair is used twice up to
15 series a colour; the memory panel draws each cluster's GPU memory."""

from __future__ import annotations

import re
from collections import Counter
from itertools import cycle
from pathlib import Path

MARKERS = "os^DvP*X<>phd8H"
FITS, MEMORY, TOKENS = "predicted fits", "predicted memory/GPU (GiB)", "predicted tokens/s/GPU"  # the report's columns
LINES = ("-", "--", "-.", ":")
# The report shows a plot at most ~1,150 px wide (render.CSS: 1200 px less its margins): drawn no wider, its
# 8-point legend stays 12 px high on screen. The legend goes under the panels, in two columns.
WIDTH_IN, DPI, LEGEND_PT = 10.0, 110, 8


def strategy(plan: str) -> str:
    """'fsdp16×tp8 sp ac-full' -> 'fsdp×tp sp ac-full' (the plan without its sizes)."""
    return re.sub(r"\b(pp|dp|fsdp|ep|tp)\d+", r"\1", str(plan))


def gpu_memory(fits: str) -> float | None:
    """'fits: 64.9 GiB of 95' -> 95.0 (the cluster's GPU memory, as the cell reported it)."""
    m = re.search(r"of (\d+(?:\.\d+)?)", str(fits))
    return float(m.group(1)) if m else None


def world_curves(table, out_dir) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = ("model", "cluster", "plan", "world", "batch/rank (seqs × seq)", FITS, MEMORY, TOKENS)
    if table.empty or any(c not in table for c in cols):
        return []
    search = table["plan"].astype(str).str.startswith(("best:", "none fits"))  # search cells: not one strategy
    predicted = table[TOKENS].astype(float).notna()  # not the gloo check
    df = table[(table["status"] == "ok") & ~search & predicted].copy()
    if df.empty:
        return []
    df["strategy"] = df["plan"].map(strategy)
    colours = dict(zip(sorted(df["model"].unique()), cycle(plt.get_cmap("tab10").colors)))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(WIDTH_IN, 4.2))
    keys = ["model", "strategy", "cluster", "batch/rank (seqs × seq)"]
    used = Counter()  # series so far per colour
    for (model, strat, cluster, batch), g in df.groupby(keys):
        g, colour = g.sort_values("world"), colours[model]
        i, used[colour] = used[colour], used[colour] + 1
        style = dict(color=colour, marker=MARKERS[i % len(MARKERS)], linestyle=LINES[i % len(LINES)])
        label = f"{model} {strat} · {cluster} · batch/rank {batch}"
        ax1.plot(g["world"], g[MEMORY].astype(float), label=label, **style)
        ax2.plot(g["world"], g[TOKENS].astype(float), label=label, **style)
    limits = df.groupby("cluster")[FITS].agg(lambda f: gpu_memory(f.iloc[0]))
    for (cluster, gib), ls in zip(limits.dropna().items(), LINES):
        ax1.axhline(gib, color="black", linestyle=ls, linewidth=1, label=f"GPU memory, {cluster}: {gib:g} GiB")
    for ax, what in ((ax1, "memory per GPU (GiB, predicted)"), (ax2, "tokens/s per GPU (predicted)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel="world size (GPUs)", ylabel=what)
        ax.grid(alpha=0.3)
    handles, labels = ax1.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=LEGEND_PT, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2)
    fig.suptitle(
        "scale: predicted per-GPU memory and throughput against world size. A line joins cells of one model, strategy, "
        "cluster and batch/rank;\nmost strategies are single cells (one world size), compare points across "
        "lines only where cluster and batch match",
        fontsize=8,
    )
    fig.tight_layout()
    path = Path(out_dir) / "scale_world_curves.png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return [path]
