"""Inference partitioning at scale, by the analytic model of Pope et al. 2022 ("Efficiently Scaling
Transformer Inference", arXiv 2211.05102, §3): a decoder-only transformer on an X·Y·Z torus of
chips, prefill (B sequences of L tokens in one step) and decode (B tokens per step against a cache of
L positions). No torch: the numbers come from the shapes and the chip's data sheet alone.

Notation (the paper's): B batch, L tokens per sequence in the step (prefill) or cached (decode),
E d_model, F d_ff, T = tokens computed per step (B·L prefill, B decode), n = X·Y·Z chips, a
activation bytes, w weight bytes (2 bf16, 1 int8). Per chip and per layer, with the lab's ring
factors (steps/analytic/comm.py: an all-gather or reduce-scatter of n bytes over N chips moves
(N-1)/N·n; the paper drops the (N-1)/N):

  1D weight-stationary  weights E×F_xyz; all-gather the input, reduce-scatter the output over all n:
                        2·T·E·a — flat in n (the paper's 2BLE)
  2D weight-stationary  weights E_x×F_yz; all-gather over yz, reduce-scatter over x, all-gather over
                        x, reduce-scatter over yz: 2·T·E·a/X + 2·T·F·a/(YZ), at X = sqrt(n·E/F)
                        8·T·E·a/sqrt(n) (the paper's 8BLE/sqrt(n)) — falls with sqrt(n)
  weight-gathered N     (N = X, XY or XYZ chips) weights stored sharded over all n, all-gathered over
                        the N chips before each layer (N/n of a layer's weights per chip), the batch
                        split over them, 1D weight-stationary over the other n/N: W_layer·w·N/n +
                        2·(T/N)·E·a — moves weights instead of activations, for large T
  attention             multi-query attention sharded over heads: its one key/value head is
                        replicated, every chip holds the whole cache; sharded over batch: each chip
                        holds its min(B, n) share, and two all-to-alls (queries in, outputs out) of
                        T·H·a/n bytes each move the queries to their batch's chip (H = heads·head
                        dim). Multi-head attention sharded over heads: cache/min(heads, n), no extra
                        collective (the projections are part of the layer's einsums).

Times per step: compute = FLOPs / (n · peak · efficiency); memory = bytes read from HBM / HBM
bandwidth (the weights each chip uses, once per step, and its KV cache); communication = bytes
above / the chip's ICI bandwidth. Composed as max(compute, memory) + communication: compute and HBM
traffic overlap on one chip, the collectives are not hidden (Pope et al. overlap part of them,
§3.5's Looped CollectiveEinsum; the fully hidden bound is max(all three), `overlapped_s`).
FLOPs = 2·params·T + 4·n_layer·H·T·L (the attention's QKᵀ and AV, over the whole L as PaLM's MFU
counts them; no causal halving); MFU = FLOPs / (step time · n · peak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from steps.analytic.comm import ring_bytes
from steps.analytic.kv_cache import CacheShape

FFN_LAYOUTS = ("1d_ws", "2d_ws", "wg_x", "wg_xy", "wg_xyz")
ATTENTION_LAYOUTS = ("heads", "batch")
PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class Chip:
    """One accelerator's data sheet."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: float
    hbm_bw: float  # bytes/s
    ici_bw: float  # bytes/s a chip moves over all its links at once
    source: str


# Pope et al. §2 ("275 TFLOPS bf16, 32 GiB of HBM at 1200 GB/s, 270 GB/s of interconnect bandwidth
# in a 3D torus"): the 270 GB/s is the chip's six ICI links together; the paper's formulas divide a
# collective's bytes by it (an assumption: a collective over one axis uses only that axis' links)
TPU_V4 = Chip("TPU v4", 275e12, 32 * 2**30, 1.2e12, 270e9, "Pope et al. 2022 §2; Google Cloud TPU v4 docs")


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer's shape (parallel attention + feed-forward blocks as PaLM's)."""

    name: str
    n_layer: int
    d_model: int  # E
    d_ff: int  # F
    n_heads: int
    head_dim: int
    n_kv_heads: int  # 1 = multi-query
    vocab: int
    ffn_matrices: int  # E×F matrices per layer: 2 (GELU MLP), 3 (SwiGLU)
    source: str

    @property
    def attn_width(self) -> int:
        """H: the queries' width, heads · head dim."""
        return self.n_heads * self.head_dim

    def layer_params(self) -> int:
        """One layer's matmul weights: the FFN's matrices, Q and O (E×H), K and V (E×kv·head dim)."""
        e = self.d_model
        return self.ffn_matrices * e * self.d_ff + 2 * e * self.attn_width + 2 * e * self.n_kv_heads * self.head_dim

    def params(self) -> int:
        """All weights: the layers and the (tied) embedding; norms left out (< 0.01 %)."""
        return self.n_layer * self.layer_params() + self.vocab * self.d_model

    def cache(self, bytes_per_element: int) -> CacheShape:
        return CacheShape(self.n_layer, self.n_kv_heads, self.head_dim, bytes_per_element)


# PaLM 540B (Chowdhery et al. 2022, Table 1 and §2: 118 layers, d_model 18432, 48 heads of 256,
# d_ff = 4·d_model, SwiGLU, multi-query attention, shared input/output embedding, 256k vocabulary)
PALM_540B = Transformer("PaLM 540B", 118, 18432, 73728, 48, 256, 1, 256_000, 3, "Chowdhery et al. 2022, Table 1, §2")


@dataclass(frozen=True)
class Torus:
    x: int
    y: int
    z: int

    @property
    def n(self) -> int:
        return self.x * self.y * self.z


def torus_for(n: int, model: Transformer) -> Torus:
    """A power-of-two torus of n chips whose X is the power of two nearest sqrt(n·E/F), the 2D
    layout's best (Pope et al. §3.2.2), the rest split as evenly as it goes (64 chips: 4×4×4)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"inference.chips: {n} is not a power of two; the torus model takes 1, 2, 4, 8, ... chips")
    best = math.sqrt(n * model.d_model / model.d_ff)
    x = min((2**k for k in range(int(math.log2(n)) + 1)), key=lambda c: (round(abs(math.log2(c / best)), 9), c))
    rest = n // x
    y = 2 ** (int(math.log2(rest)) // 2)
    return Torus(x, y, rest // y)


@dataclass(frozen=True)
class Setting:
    """One point: a model on a torus, a layout, a phase and its batch."""

    model: Transformer
    chip: Chip
    torus: Torus
    ffn: str  # one of FFN_LAYOUTS
    attention: str  # one of ATTENTION_LAYOUTS
    phase: str  # prefill | decode
    batch: int
    context: int  # L: prefill tokens per sequence, or the decode's cached positions
    weight_bytes: int = 2  # 1 = int8 weights
    act_bytes: int = 2
    cache_bytes: int = 2
    efficiency: float = 1.0  # the share of peak FLOP/s a matmul reaches (one constant, stated)
    ring: bool = True  # the lab's ring factors (N-1)/N; False: the paper's convention, a collective moves all n bytes

    def __post_init__(self):
        for name, value, allowed in (("ffn", self.ffn, FFN_LAYOUTS), ("attention", self.attention, ATTENTION_LAYOUTS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r}: use one of {allowed}")
        if self.phase not in PHASES:
            raise ValueError(f"phase={self.phase!r}: use one of {PHASES}")

    @property
    def tokens(self) -> int:
        """T: tokens computed per step."""
        return self.batch * self.context if self.phase == "prefill" else self.batch

    @property
    def gathered_over(self) -> int:
        """N: chips a weight-gathered layout gathers over (1 for the weight-stationary ones)."""
        t = self.torus
        return {"wg_x": t.x, "wg_xy": t.x * t.y, "wg_xyz": t.n}.get(self.ffn, 1)


def flops(s: Setting) -> float:
    """Model FLOPs of one step: 2·params per token and the attention's 4·n_layer·H·L per token."""
    m = s.model
    return 2 * m.params() * s.tokens + 4 * m.n_layer * m.attn_width * s.tokens * s.context


def _moved(s: Setting, op: str, nbytes: float, n: int) -> float:
    """Bytes one chip moves for collective `op` over n chips: with the ring factor, or (the paper's
    convention, `ring=False`) all of nbytes; nothing over one chip either way."""
    if not s.ring:
        return float(nbytes) if n > 1 else 0.0
    return ring_bytes(op, nbytes, n)


def ffn_comm_bytes(s: Setting) -> float:
    """Bytes one chip moves per layer for the feed-forward (and fused attention projections)."""
    t, n, tok, a, e = s.torus, s.torus.n, s.tokens, s.act_bytes, s.model.d_model
    if s.ffn == "1d_ws":
        return 2 * _moved(s, "all_gather", tok * e * a, n)
    if s.ffn == "2d_ws":
        yz = t.y * t.z
        return 2 * _moved(s, "all_gather", tok * e * a / t.x, yz) + 2 * _moved(
            s, "all_gather", tok * s.model.d_ff * a / yz, t.x
        )
    big_n = s.gathered_over
    weights = _moved(s, "all_gather", s.model.layer_params() * s.weight_bytes * big_n / n, big_n)
    return weights + 2 * _moved(s, "all_gather", tok / big_n * e * a, n // big_n)


def attention_comm_bytes(s: Setting) -> float:
    """Bytes one chip moves per layer to run attention batch-sharded: two all-to-alls of its share
    of the queries (in) and of the attention outputs (out); none sharded over heads."""
    if s.attention == "heads":
        return 0.0
    n = s.torus.n
    return 2 * _moved(s, "all_to_all", s.tokens * s.model.attn_width * s.act_bytes / n, n)


def cache_per_chip(s: Setting, positions: int | None = None) -> float:
    """KV-cache bytes one chip holds: over heads each chip keeps min(kv heads, n)⁻¹ of it (multi-
    query: all of it), over batch min(B, n)⁻¹."""
    total = s.model.cache(s.cache_bytes).bytes(s.batch, s.context if positions is None else positions)
    ways = s.model.n_kv_heads if s.attention == "heads" else s.batch
    return total / min(ways, s.torus.n)


def weights_per_chip(s: Setting) -> float:
    """Weight bytes one chip stores: every layout keeps 1/n of them (a weight-gathered one gathers a
    layer at a time, `gathered_layer_bytes` more while it runs)."""
    return s.model.params() * s.weight_bytes / s.torus.n


def gathered_layer_bytes(s: Setting) -> float:
    return s.model.layer_params() * s.weight_bytes * s.gathered_over / s.torus.n


def hbm_read_bytes(s: Setting) -> float:
    """Bytes one chip reads from HBM per step: the weights it multiplies by (its shard; a gathered
    layout its gathered copy, N× more) and its KV cache (decode reads it, prefill writes it)."""
    return weights_per_chip(s) * s.gathered_over + cache_per_chip(s)


@dataclass(frozen=True)
class Cost:
    flops: float
    compute_s: float
    memory_s: float
    comm_s: float
    comm_bytes_per_layer: float
    weights_bytes: float  # per chip
    cache_bytes: float  # per chip
    fits: bool  # weights + cache + a gathered layer within the chip's HBM

    @property
    def step_s(self) -> float:
        """max(compute, memory) + communication: the stated composition."""
        return max(self.compute_s, self.memory_s) + self.comm_s

    @property
    def overlapped_s(self) -> float:
        """The lower bound when every collective hides behind compute or memory."""
        return max(self.compute_s, self.memory_s, self.comm_s)


def cost(s: Setting) -> Cost:
    """The step's times and per-chip bytes under the model above."""
    n, chip = s.torus.n, s.chip
    per_layer = ffn_comm_bytes(s) + attention_comm_bytes(s)
    weights, cache = weights_per_chip(s), cache_per_chip(s)
    return Cost(
        flops=flops(s),
        compute_s=flops(s) / (n * chip.peak_flops * s.efficiency),
        memory_s=hbm_read_bytes(s) / chip.hbm_bw,
        comm_s=s.model.n_layer * per_layer / chip.ici_bw,
        comm_bytes_per_layer=per_layer,
        weights_bytes=weights,
        cache_bytes=cache,
        fits=weights + cache + gathered_layer_bytes(s) <= chip.hbm_bytes,
    )


def mfu(s: Setting, c: Cost | None = None) -> float:
    """Model FLOPs utilisation of the step: its FLOPs over step time · chips · peak."""
    c = c or cost(s)
    return c.flops / (c.step_s * s.torus.n * s.chip.peak_flops)


def latency_per_token_s(s: Setting, c: Cost | None = None) -> float:
    """Decode: one step generates a token for each sequence, so its time is the per-token latency;
    prefill: the whole prompt's time."""
    return (c or cost(s)).step_s
