"""perf: the single-device performance matrix and memory accounting (the seed's "single card
perf" table). The stage is this package: `python -m steps.perf` (see __main__.py); the cell logic
is in stage.py, the training step and its knobs in step.py, memory in memory.py, the fused
kernels in fused.py (+ triton_kernels.py on CUDA).

This package's own import stays light, for two reasons: `steps.config` imports `steps.perf.ladder`
while Snakemake plans the DAG (which runs this file first), and `python -m steps.perf` re-executes
itself with a malloc setting before any real work (__main__.py). So `run` imports the cell logic
when a cell runs, and the figures import matplotlib when the report draws them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from steps.stage import Stage


def run(ctx):
    from steps.perf.stage import run as run_cell  # see the module docstring: not at planning time

    return run_cell(ctx)


def report_figures(table, out_dir, folders):
    """Bar chart of tokens/s per cell (skipped cells grey) + the timeline cell's memory plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if table.empty or "tokens/s" not in table:
        return []
    figs = []
    for cell in table["cell"]:
        png = folders[cell] / "memory_timeline.png"
        if png.exists():
            figs.append(Path(shutil.copy(png, Path(out_dir) / f"perf_memory_timeline_{cell}.png")))
    labels = [f"{c}\n(skipped)" if s != "ok" else c for c, s in zip(table["cell"], table["status"])]
    values = table["tokens/s"].astype(float).fillna(0.0)
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(table)), 4))
    bars = ax.bar(range(len(table)), values, color=["tab:blue" if s == "ok" else "lightgray" for s in table["status"]])
    for bar, x in zip(bars, table.get("× baseline", [None] * len(table))):
        if x == x and x is not None:  # not NaN
            ax.annotate(
                f"{float(x):.2f}×",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(len(table)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("tokens/s (median)")
    ax.set_title(f"perf matrix on {table['device'].dropna().iloc[0] if table['device'].notna().any() else '?'}")
    path = Path(out_dir) / "perf_tokens_per_s.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path, *figs]


STAGE = Stage(
    __spec__.name,
    run,
    columns={
        "Desc": "info.desc",
        "Change": "info.change",
        "device": "info.device",
        "tokens/s": "metrics.tokens_per_s",
        "p10": "metrics.tokens_per_s_p10",
        "p90": "metrics.tokens_per_s_p90",
        "× baseline": "metrics.speedup",
        "MFU": "metrics.mfu",
        "MFU (published peak)": "metrics.mfu_published",
        "peak memory (MiB)": "metrics.peak_mem_mib",
        "loss": "metrics.loss",
        "drift": "metrics.loss_drift",
        "state mem err %": "metrics.mem_state_err_pct",
        "peak mem err %": "metrics.mem_peak_err_pct",
    },
    headline=("best speedup over the fp32 eager baseline", "× baseline", "max"),
    curves=["train_loss", "step_time_ms"],
    tables=["memory", "memory_timeline"],  # analytic vs measured per cell; the timeline cell
    figures=report_figures,
)
