"""The `partition` cell: Pope et al. 2022's partitioning layouts for PaLM 540B on TPU v4, by the
analytic model (steps/analytic/inference_partition.py; no torch, no measurement: every number here
is a prediction), tabulated against chip count and batch, and checked against the paper's two
published points.

The published points (Pope et al. 2022, abstract and Table 2, PaLM 540B on 64 TPU v4 chips, a
2048-token context):
  decode   29 ms per generated token at low batch (Table 2's low-latency column: batch 64, 2D
           weight-stationary feed-forward, multi-query attention sharded over batch, int8
           weights; 1.82 s for 64 tokens, 28.4 ms each; the abstract rounds to 29 ms)
  prefill  76 % MFU on large-batch prefill (Table 2's high-throughput column: batch 512 of 2048
           tokens, XYZ weight-gathered feed-forward, attention over batch, bf16 weights)
"""

from __future__ import annotations

import pandas as pd

from steps.analytic.inference_partition import (
    ATTENTION_LAYOUTS,
    FFN_LAYOUTS,
    PALM_540B,
    TPU_V4,
    Setting,
    cost,
    mfu,
    torus_for,
)
from steps.inference.pope import relative_checks

PUBLISHED = {
    "decode": {"chips": 64, "batch": 64, "ffn": "2d_ws", "attention": "batch", "weight_bytes": 1, "ms_per_token": 29.0},
    "prefill": {"chips": 64, "batch": 512, "ffn": "wg_xyz", "attention": "batch", "weight_bytes": 2, "mfu": 0.76},
}
# (phase, weight bytes) the table sweeps: prefill in bf16, decode in bf16 and int8 (the paper's low-latency format)
FORMATS = (("prefill", 2), ("decode", 2), ("decode", 1))
WEIGHT_NAMES = {1: "int8", 2: "bf16"}


def published_setting(phase: str, context: int, efficiency: float = 1.0) -> Setting:
    """The paper's configuration behind one published point."""
    p = PUBLISHED[phase]
    return Setting(
        PALM_540B,
        TPU_V4,
        torus_for(p["chips"], PALM_540B),
        p["ffn"],
        p["attention"],
        phase,
        p["batch"],
        context,
        weight_bytes=p["weight_bytes"],
        efficiency=efficiency,
    )


def published_checks(context: int = 2048, efficiency: float = 1.0) -> dict:
    """The model at the two published points, and predicted ÷ published for each."""
    dec, pre = published_setting("decode", context, efficiency), published_setting("prefill", context, efficiency)
    dec_ms = cost(dec).step_s * 1e3
    pre_mfu = mfu(pre)
    return {
        "predicted_decode_ms_per_token": dec_ms,
        "predicted_decode_over_published": dec_ms / PUBLISHED["decode"]["ms_per_token"],
        "predicted_prefill_mfu": pre_mfu,
        "predicted_prefill_mfu_over_published": pre_mfu / PUBLISHED["prefill"]["mfu"],
        "predicted_prefill_s": cost(pre).step_s,
    }


def row(s: Setting) -> dict:
    """One table row: the setting and what the model predicts for it (every column a prediction)."""
    c = cost(s)
    return {
        "phase": s.phase,
        "weights": WEIGHT_NAMES[s.weight_bytes],
        "chips": s.torus.n,
        "torus": f"{s.torus.x}x{s.torus.y}x{s.torus.z}",
        "batch": s.batch,
        "ffn layout": s.ffn,
        "attention sharded over": s.attention,
        "predicted weights GiB/chip": c.weights_bytes / 2**30,
        "predicted KV cache GiB/chip": c.cache_bytes / 2**30,
        "predicted fits HBM": c.fits,
        "predicted comm MB/layer/chip": c.comm_bytes_per_layer / 1e6,
        "predicted compute ms": c.compute_s * 1e3,
        "predicted memory ms": c.memory_s * 1e3,
        "predicted comm ms": c.comm_s * 1e3,
        "predicted step ms": c.step_s * 1e3,
        "predicted ms/token": c.step_s * 1e3 / (s.context if s.phase == "prefill" else 1),
        "predicted MFU": mfu(s, c),
    }


def sweep(chips, batches, context: int, efficiency: float = 1.0) -> pd.DataFrame:
    """Every layout × chip count × batch × (phase, weight format), PaLM 540B on TPU v4."""
    rows = []
    for n in chips:
        torus = torus_for(n, PALM_540B)
        for (phase, wb), b, ffn, attn in (
            (f, b, ffn, a) for f in FORMATS for b in batches for ffn in FFN_LAYOUTS for a in ATTENTION_LAYOUTS
        ):
            s = Setting(PALM_540B, TPU_V4, torus, ffn, attn, phase, b, context, weight_bytes=wb, efficiency=efficiency)
            rows.append(row(s))
    return pd.DataFrame(rows)


def comm_trend(df: pd.DataFrame, batch: int) -> dict:
    """Decode's communication per layer from the fewest chips to the most, at one batch: 2D weight-
    stationary falls (≈ sqrt of the chip ratio), 1D stays flat."""
    sel = df[(df["phase"] == "decode") & (df["weights"] == "bf16") & (df["batch"] == batch)]
    sel = sel[sel["attention sharded over"] == "heads"]
    out = {}
    for ffn in ("1d_ws", "2d_ws"):
        by_chips = sel[sel["ffn layout"] == ffn].set_index("chips")["predicted comm MB/layer/chip"]
        out[f"predicted_{ffn}_comm_fewest_over_most_chips"] = float(by_chips.iloc[0] / by_chips.iloc[-1])
    return out


def partition(ctx, p, device) -> dict:
    """Tabulate the layouts, plot them as the paper's Figure 1 does, and check the published points."""
    df = sweep(p.chips, p.batch_sizes, p.prompt_len, p.efficiency)
    ctx.log_table(df, "partition")
    ctx.log_figure(partition_figure(df, p.prompt_len), "partition")
    metrics = published_checks(p.prompt_len, p.efficiency)
    metrics.update(comm_trend(df, max(p.batch_sizes)))
    metrics.update(relative_checks())  # Pope et al.'s relative results, computed (steps/inference/pope.py)
    return metrics


def partition_figure(df: pd.DataFrame, context: int, chips: int = 64):
    """Left: decode latency per token vs batch per feed-forward layout (int8, attention over batch)
    at `chips` chips; middle: prefill MFU vs batch (bf16); right: decode communication per layer vs
    chip count (batch the largest). The published points as stars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    over_batch = df[df["attention sharded over"] == "batch"]
    panels = (
        (axes[0], "decode", "int8", "predicted ms/token", "decode ms/token (predicted)"),
        (axes[1], "prefill", "bf16", "predicted MFU", "prefill MFU (predicted)"),
    )
    for ax, phase, weights, col, label in panels:
        sel = over_batch[(over_batch["phase"] == phase) & (over_batch["weights"] == weights)]
        sel = sel[(sel["chips"] == chips) & sel["predicted fits HBM"]]
        for ffn, g in sel.groupby("ffn layout"):
            ax.plot(g["batch"], g[col], marker="o", label=ffn)
        ax.set(xscale="log", xlabel="batch", ylabel=label, title=f"PaLM 540B, {chips} TPU v4, {phase}, {weights}")
    axes[0].set_yscale("log")  # the weight-gathered layouts take 10-1000× longer to decode
    pub = PUBLISHED
    axes[0].plot([pub["decode"]["batch"]], [pub["decode"]["ms_per_token"]], "k*", ms=12, label="published")
    axes[1].plot([pub["prefill"]["batch"]], [pub["prefill"]["mfu"]], "k*", ms=12, label="published")
    dec = over_batch[(over_batch["phase"] == "decode") & (over_batch["weights"] == "bf16")]
    dec = dec[dec["batch"] == dec["batch"].max()]
    for ffn, g in dec.groupby("ffn layout"):
        axes[2].plot(g["chips"], g["predicted comm MB/layer/chip"], marker="o", label=ffn)
    axes[2].set(xscale="log", yscale="log", xlabel="chips", ylabel="comm MB/layer/chip (predicted)", title="decode")
    axes[2].set_xticks(sorted(dec["chips"].unique()), [str(c) for c in sorted(dec["chips"].unique())])
    axes[2].minorticks_off()
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(f"Pope et al. 2022's layouts by the analytic model (context {context}): predictions, not measurements")
    fig.tight_layout()
    return fig
