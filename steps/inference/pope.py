"""Pope et al. 2022's relative results, each computed by the partitioning model
(steps/analytic/inference_partition.py) and set beside the paper's figure or table. The paper's
absolute decode latency (29 ms/token) needs a per-collective latency the paper does not publish
(docs/inference.md); these results are ratios and crossovers, which the model can state honestly.

The paper's text is not stored on this machine (no copy in ../shared/seeds, none found by search):
every published value below is marked `as recalled` (taken from issue #50 or from memory of the
paper, not re-read); check them in arXiv 2211.05102 before quoting them elsewhere. Every computed value
is a prediction of the model, no measurement.

  crossover   2D weight-stationary moves fewer bytes than 1D once sqrt(n) > d_ff/d_model (§3.2.2;
              Figure 2/3 as recalled); the model, in the paper's convention (no ring factors):
              2·T·E·a against 4·T·a·sqrt(E·F/n) at the best X, so 2D wins once n > 4·F/E, i.e.
              sqrt(n) > 2·sqrt(F/E): the paper's rule where F = 4E (PaLM), not for other ratios
  prefill     weight-gathered overtakes weight-stationary as tokens per batch grow, gathering over
              more chips the more tokens (Figure 3 as recalled: one feed-forward layer, E 16384,
              F 65536, a 4×4×4 torus); the model's crossover token counts
  multiquery  the largest context at batch 128 / 512 for PaLM 540B on 64 chips, the KV cache given
              30 % of each chip's HBM (Table 1 as recalled, budget as recalled)
  int8        int8 against bf16 weights at the low-latency decode point (28.5 vs 36.9 ms, as
              recalled): a fixed per-step cost cancels in their difference, not in their ratio
"""

from __future__ import annotations

import dataclasses
import math

from steps.analytic.inference_partition import (
    PALM_540B,
    TPU_V4,
    Setting,
    Torus,
    Transformer,
    cache_per_chip,
    cost,
    ffn_comm_bytes,
    torus_for,
)

# (value, where in the paper): every value as recalled, none re-read (the paper's text is not stored here)
PAPER = {
    "crossover_rule": ("2D beats 1D once sqrt(chips) > d_ff/d_model", "§3.2.2, Figure 2"),
    "prefill_order": ("2D WS, then X, XY, XYZ weight-gathered as tokens grow", "Figure 3"),
    "multiquery": (
        {
            ("multihead", 128): 1320,
            ("multihead", 512): 330,
            ("multiquery over heads", 128): 660,
            ("multiquery over batch", 128): 43000,
            ("multiquery over heads", 512): 165,
            ("multiquery over batch", 512): 10700,
        },
        "Table 1: PaLM 540B, 64 chips, 30 % of HBM for the KV cache",
    ),
    "int8_decode_ms": (28.5, "§4.4, the low-latency decode point"),
    "bf16_decode_ms": (36.9, "the same point in bf16"),
}
KV_SHARE = 0.30  # Table 1's KV-cache budget, a share of each chip's HBM (as recalled)
# Figure 3's layer (as recalled): one feed-forward layer of two E×F matrices, no attention, E 16384, F 65536
FIG3_FFN = Transformer(
    "Figure 3 feed-forward", 1, 16384, 65536, 0, 0, 0, 0, 2, "Pope et al. 2022 Figure 3 (as recalled)"
)
PREFILL_ORDER = ("2d_ws", "wg_x", "wg_xy", "wg_xyz")
MULTIQUERY_ROWS = (
    ("multihead", "heads", PALM_540B.n_heads),
    ("multiquery over heads", "heads", 1),
    ("multiquery over batch", "batch", 1),
)


def _setting(model: Transformer, torus: Torus, ffn: str, phase: str, batch: int, context: int, **kw) -> Setting:
    return Setting(model, TPU_V4, torus, ffn, kw.pop("attention", "heads"), phase, batch, context, **kw)


def ws_comm_ratio(n: int, model: Transformer = PALM_540B, ring: bool = False) -> float:
    """Decode communication per layer, 2D weight-stationary ÷ 1D, on the torus for n chips."""
    torus = torus_for(n, model)
    one, two = (ffn_comm_bytes(_setting(model, torus, f, "decode", 64, 2048, ring=ring)) for f in ("1d_ws", "2d_ws"))
    return two / one


def ws_crossover(model: Transformer = PALM_540B, ring: bool = False, most: int = 2**16) -> int:
    """The fewest chips (a power of two) at which 2D weight-stationary moves fewer bytes than 1D."""
    n = 2  # one chip moves nothing under either layout
    while n <= most:
        if ws_comm_ratio(n, model, ring) < 1 - 1e-12:
            return n
        n *= 2
    raise ValueError(f"2D never beats 1D up to {most} chips for {model.name}")


def ws_crossover_continuous(model: Transformer = PALM_540B) -> float:
    """The chip count where 2·T·E·a = 4·T·a·sqrt(E·F/n) (the best X, no ring factors): n* = 4·F/E."""
    return 4 * model.d_ff / model.d_model


def prefill_crossovers(
    model: Transformer = FIG3_FFN, torus: Torus = Torus(4, 4, 4), ring: bool = False
) -> dict[str, float]:
    """Tokens per batch at which each next layout of PREFILL_ORDER starts to move fewer bytes than
    the one before it: each layout's bytes are affine in T, so two points give the crossing exactly."""

    def line(ffn: str) -> tuple[float, float]:
        at = [ffn_comm_bytes(_setting(model, torus, ffn, "prefill", t, 1, ring=ring)) for t in (0, 1)]
        return at[0], at[1] - at[0]

    out = {}
    for before, after in zip(PREFILL_ORDER, PREFILL_ORDER[1:]):
        (c0, c1), (d0, d1) = line(before), line(after)
        out[f"{before}->{after}"] = (d0 - c0) / (c1 - d1)
    return out


def best_prefill_layout(tokens: int, model: Transformer = FIG3_FFN, torus: Torus = Torus(4, 4, 4)) -> str:
    return min(PREFILL_ORDER, key=lambda f: ffn_comm_bytes(_setting(model, torus, f, "prefill", tokens, 1, ring=False)))


def max_context(kind: str, batch: int, chips: int = 64, share: float = KV_SHARE) -> int:
    """The longest context whose KV cache fits `share` of a chip's HBM (Table 1's question)."""
    name, attention, kv_heads = next(r for r in MULTIQUERY_ROWS if r[0] == kind)
    model = dataclasses.replace(PALM_540B, n_kv_heads=kv_heads)
    s = _setting(model, torus_for(chips, model), "2d_ws", "decode", batch, 1, attention=attention)
    return math.floor(share * TPU_V4.hbm_bytes / cache_per_chip(s, positions=1))


def decode_point(weight_bytes: int) -> Setting:
    """The low-latency decode point: 64 chips, batch 64, 2D WS, multi-query over batch, context 2048."""
    return _setting(
        PALM_540B, torus_for(64, PALM_540B), "2d_ws", "decode", 64, 2048, attention="batch", weight_bytes=weight_bytes
    )


def int8_vs_bf16() -> dict[str, float]:
    int8, bf16 = (cost(decode_point(b)).step_s * 1e3 for b in (1, 2))
    p8, p16 = PAPER["int8_decode_ms"][0], PAPER["bf16_decode_ms"][0]
    return {
        "computed_int8_ms": int8,
        "computed_bf16_ms": bf16,
        "computed_bf16_over_int8": bf16 / int8,
        "paper_bf16_over_int8": p16 / p8,
        "computed_bf16_minus_int8_ms": bf16 - int8,
        "paper_bf16_minus_int8_ms": p16 - p8,
    }


def relative_checks() -> dict[str, float]:
    """Every relative result as a flat dict of computed numbers (the partition cell logs them)."""
    out = {
        "computed_2d_over_1d_crossover_chips": float(ws_crossover()),
        "computed_2d_over_1d_crossover_chips_ring": float(ws_crossover(ring=True)),
        "computed_2d_over_1d_continuous_chips": ws_crossover_continuous(),
    }
    for name, tokens in prefill_crossovers().items():
        out[f"computed_prefill_crossover_tokens_{name.replace('->', '_to_')}"] = tokens
    table = PAPER["multiquery"][0]
    for (kind, batch), published in table.items():
        key = kind.replace(" ", "_")
        out[f"computed_max_context_{key}_b{batch}"] = float(max_context(kind, batch))
        out[f"computed_over_paper_max_context_{key}_b{batch}"] = max_context(kind, batch) / published
    out.update({k: v for k, v in int8_vs_bf16().items() if k.startswith("computed")})
    return out


def markdown() -> str:
    """The generated block of docs/inference.md: each relative result, computed beside the paper's."""
    rule, order = PAPER["crossover_rule"], PAPER["prefill_order"]
    ratios = ", ".join(f"{n}: {ws_comm_ratio(n):.3g}" for n in (8, 16, 32, 64, 256))
    rows = [
        [
            f"2D vs 1D weight-stationary decode ({rule[1]})",
            f"{rule[0]}: for PaLM (F/E = 4) from 32 chips on a power-of-two torus",
            f"2D moves fewer bytes from {ws_crossover()} chips (2D ÷ 1D per layer at {ratios}); "
            f"continuous n* = 4F/E = {ws_crossover_continuous():g}; with the lab's ring factors from "
            f"{ws_crossover(ring=True)} chips",
        ],
        [
            f"weight-gathered vs weight-stationary prefill ({order[1]}: one FFN layer, E 16384, F 65536, 4×4×4)",
            order[0],
            "; ".join(f"{k.replace('->', ' → ')} at {v:,.0f} tokens" for k, v in prefill_crossovers().items()),
        ],
    ]
    table, source = PAPER["multiquery"]
    for kind, _, _ in MULTIQUERY_ROWS:
        got = [(max_context(kind, b), table[kind, b]) for b in (128, 512)]
        rows.append(
            [
                f"max context, {kind}, batch 128 / 512 ({source})",
                " / ".join(f"{p:,}" for _, p in got),
                " / ".join(f"{c:,}" for c, _ in got) + " (÷ paper " + " / ".join(f"{c / p:.3f}" for c, p in got) + ")",
            ]
        )
    q = int8_vs_bf16()
    rows.append(
        [
            f"int8 vs bf16 weights, decode ({PAPER['int8_decode_ms'][1]})",
            f"{PAPER['int8_decode_ms'][0]} vs {PAPER['bf16_decode_ms'][0]} ms: ratio {q['paper_bf16_over_int8']:.3f}, "
            f"difference {q['paper_bf16_minus_int8_ms']:.1f} ms",
            f"{q['computed_int8_ms']:.2f} vs {q['computed_bf16_ms']:.2f} ms: ratio {q['computed_bf16_over_int8']:.3f}, "
            f"difference {q['computed_bf16_minus_int8_ms']:.2f} ms "
            f"(÷ paper {q['computed_bf16_minus_int8_ms'] / q['paper_bf16_minus_int8_ms']:.3f})",
        ]
    )
    head = ["result (where in the paper)", "paper (as recalled, not re-read)", "computed by the model (no measurement)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
