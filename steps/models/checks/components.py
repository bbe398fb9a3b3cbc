"""Parity rows of the hand-written pieces: softmax, linear, LayerNorm/RMSNorm, positional encodings
(sinusoidal, RoPE both layouts) and masks, each against torch, NumPy and transformers (sinusoidal PE:
also transformers' XLM table; tests/test_gpt_components.py checks it against the formula written out)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_rope
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rope
from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings as xlm_sinusoidal

from steps.models import masking as M
from steps.models import positional as P
from steps.models.checks.harness import _t, function_rows, register_parity, row
from steps.models.linear import linear, linear_np
from steps.models.norms import layer_norm, layer_norm_np, rms_norm, rms_norm_np
from steps.models.softmax import softmax, softmax_np


@register_parity
def softmax_checks(params) -> list[dict]:
    x = _t(3, 5)
    mask = torch.rand(3, 5) > 0.3
    mask[:, 0] = True  # every row keeps one entry
    rows = function_rows(
        "softmax", lambda x: softmax(x), lambda x: F.softmax(x, -1), softmax_np, [x], [x.detach().numpy()]
    )
    rows += function_rows(
        "masked softmax",
        lambda x: softmax(x, mask),
        lambda x: F.softmax(x.masked_fill(~mask, float("-inf")), -1),
        lambda x: softmax_np(x, mask=mask.numpy()),
        [x],
        [x.detach().numpy()],
    )
    big = torch.tensor([[1000.0, 1001.0, 999.0]], dtype=torch.float64)
    rows.append(row("softmax, logits ~1e3 (stability)", "torch (fp64)", softmax(big), F.softmax(big, -1), 1e-12))
    return rows


@register_parity
def linear_checks(params) -> list[dict]:
    x, w, b = _t(2, 3, 4), _t(5, 4), _t(5)
    return function_rows("linear", linear, F.linear, linear_np, [x, w, b], [t.detach().numpy() for t in (x, w, b)])


@register_parity
def norm_checks(params) -> list[dict]:
    x, w, b = _t(2, 3, 6), _t(6), _t(6)
    rows = function_rows(
        "LayerNorm",
        lambda x, w, b: layer_norm(x, w, b, 1e-5),
        lambda x, w, b: F.layer_norm(x, (6,), w, b, 1e-5),
        lambda x, w, b: layer_norm_np(x, w, b, 1e-5),
        [x, w, b],
        [t.detach().numpy() for t in (x, w, b)],
    )
    rows += function_rows(
        "RMSNorm",
        lambda x, w: rms_norm(x, w, 1e-6),
        lambda x, w: F.rms_norm(x, (6,), w, 1e-6),
        lambda x, w: rms_norm_np(x, w, 1e-6),
        [x, w],
        [t.detach().numpy() for t in (x, w)],
    )
    return rows


@register_parity
def positional_checks(params) -> list[dict]:

    T, d = 7, 8
    pe = P.sinusoidal(T, d, dtype=torch.float64)
    rows = [row("sinusoidal PE (torch)", "NumPy twin", pe, P.sinusoidal_np(T, d), 1e-12)]
    # an implementation the lab did not write; it rounds its table to float32 (half an ulp at 1: 3e-8)
    n_pos, wide = 64, 10  # positions up to 63 and an even width: a wrong frequency shows
    ref = xlm_sinusoidal(n_pos, wide, torch.empty(n_pos, wide, dtype=torch.float64))
    rows.append(row("sinusoidal PE (torch)", "transformers XLM create_sinusoidal_embeddings (fp32 table)",
                    P.sinusoidal(n_pos, wide, dtype=torch.float64), ref, 1e-7))  # fmt: skip
    x = torch.randn(2, 3, T, d, dtype=torch.float64)  # (B, heads, T, head_dim)
    cos, sin = P.rope_cos_sin(T, d, dtype=torch.float64)
    inter, neox = P.rope_interleaved(x, cos, sin), P.rope_neox(x, cos, sin)
    rows.append(row("RoPE interleaved (torch)", "NumPy twin", inter, P.rope_interleaved_np(x.numpy()), 1e-12))
    rows.append(row("RoPE NeoX (torch)", "NumPy twin", neox, P.rope_neox_np(x.numpy()), 1e-12))
    # GPT-J expects (B, T, heads, d) and sin/cos (B, T, d/2); Llama expects (B, T, d) tables
    ref_j = gptj_rope(x.transpose(1, 2), sin[None], cos[None]).transpose(1, 2)
    rows.append(row("RoPE interleaved (torch)", "transformers GPT-J apply_rotary_pos_emb", inter, ref_j, 1e-12))
    cat = lambda t: torch.cat([t, t], -1)[None]  # noqa: E731 - Llama's tables repeat the halves
    ref_l, _ = llama_rope(x, x, cat(cos), cat(sin))
    rows.append(row("RoPE NeoX (torch)", "transformers Llama apply_rotary_pos_emb", neox, ref_l, 1e-12))
    # relative-position property: <rope(q)_m, rope(k)_n> depends on m - n only
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    rq = P.rope_neox(q.expand(T, d), cos, sin)
    rk = P.rope_neox(k.expand(T, d), cos, sin)
    rows.append(
        row(
            "RoPE NeoX <q_m,k_n>",
            "same at m-n=1 for all m",
            (rq[1:] * rk[:-1]).sum(-1),
            (rq[1] * rk[0]).sum().expand(T - 1),
            1e-12,
        )
    )
    return rows


@register_parity
def masking_checks(params) -> list[dict]:
    B, T, d = 3, 6, 4
    lengths = [6, 4, 2]
    ref = np.array([[[j <= i and j < L for j in range(T)] for i in range(T)] for L in lengths])
    rows = [
        row("combined causal+padding mask (NumPy)", "explicit loops", M.combined_mask(lengths, T), ref, 0.0),
        row(
            "causal mask with cache offset (NumPy)",
            "torch tril(diagonal=offset)",
            M.causal_mask(2, 5),
            torch.ones(2, 5).tril(3).bool(),
            0.0,
        ),
    ]
    q, k, v = (torch.randn(B, 1, T, d, dtype=torch.float64) for _ in range(3))
    mask = torch.from_numpy(M.combined_mask(lengths, T))[:, None]
    ours = softmax(q @ k.transpose(-1, -2) / d**0.5, mask) @ v
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    rows.append(row("masked attention (hand softmax + NumPy mask)", "F.scaled_dot_product_attention", ours, ref, 1e-12))
    return rows
