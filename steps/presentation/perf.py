"""What the perf stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from steps.presentation import Presentation


def report_figures(table, out_dir, folders):
    """× baseline per cell with its 95 % interval (skipped cells grey, at 0) + the timeline
    cell's memory plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    if table.empty or "× baseline" not in table:
        return []
    figs = []
    for cell in table["cell"]:
        png = folders[cell] / "memory_timeline.png"
        if png.exists():
            figs.append(Path(shutil.copy(png, Path(out_dir) / f"perf_memory_timeline_{cell}.png")))
    num = {c: table[c].astype(float).to_numpy() if c in table else np.full(len(table), np.nan) for c in COLS}
    ratio, low, high = (np.nan_to_num(num[c]) for c in COLS)
    errors = np.where(np.isnan(num["low"]), 0.0, [ratio - low, high - ratio])
    labels = [f"{c}\n(skipped)" if s != "ok" else c for c, s in zip(table["cell"], table["status"])]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(table)), 4))
    colors = ["tab:blue" if s == "ok" else "lightgray" for s in table["status"]]
    ax.bar(range(len(table)), ratio, yerr=errors, color=colors, capsize=2)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(table)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("× baseline tokens/s (95 % interval)")
    device = table["device"].dropna().iloc[0] if "device" in table and table["device"].notna().any() else "?"
    ax.set_title(f"perf matrix on {device}: each cell interleaved with the baseline step")
    path = Path(out_dir) / "perf_speedup.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [path, *figs]


COLS = ("× baseline", "low", "high")  # the ratio and its interval, as the report table names them


SHOWN = Presentation(
    columns={
        "Desc": "info.desc",
        "Change": "info.change",
        "device": "info.device",
        "tokens/s": "metrics.tokens_per_s",
        "p10": "metrics.tokens_per_s_p10",
        "p90": "metrics.tokens_per_s_p90",
        "× baseline": "metrics.speedup",
        "low": "metrics.speedup_low",
        "high": "metrics.speedup_high",
        "pairs": "metrics.speedup_pairs",
        "vs baseline": "info.vs_baseline",
        "baseline tokens/s": "metrics.baseline_tokens_per_s",
        "MFU": "metrics.mfu",
        "MFU (published peak)": "metrics.mfu_published",
        "peak memory (MiB)": "metrics.peak_mem_mib",
        "loss": "metrics.loss",
        "drift": "metrics.loss_drift",
        "state mem err %": "metrics.mem_state_err_pct",
        "optimizer MiB (analytic)": "metrics.mem_optimizer_analytic_mib",
        "optimizer MiB (measured)": "metrics.mem_optimizer_measured_mib",
        "peak mem err %": "metrics.mem_peak_err_pct",
    },
    # × baseline is measured side by side in each cell's process (steps/perf/measure.py): a cell
    # is named only when its 95 % interval lies above 1
    headline=("best speedup over the fp32 eager baseline (interleaved, 95 % interval)", "× baseline", "max"),
    headline_if=("vs baseline", "faster"),
    headline_none="none: no cell beat the baseline beyond noise",
    headline_interval=("low", "high"),
    curves=["train_loss", "step_time_ms"],
    tables=["memory", "memory_timeline"],  # analytic vs measured per cell; the timeline cell
    figures=report_figures,
)
