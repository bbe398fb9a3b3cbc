"""The seed's GPT-2 bug catalogue (001, "Parity debugging"), planted one at a time in a copy of our model,
to show that the layer-by-layer harness (parity.compare) names the first module whose output differs.

Each bug is planted from outside: the model files are not touched. `plant(hf, bug)` returns our GPT
built from the HF GPT-2 weights with the bug in it; `catalogue_rows` runs compare() on each and keeps,
per bug, the first forward point (in forward order: embeddings, h.0.ln_1, h.0.attn, h.0.residual,
h.0.ln_2, h.0.mlp, h.0.out, h.1..., ln_f, logits) that fails its tolerance, and by how much.

- dropout left on in eval: every nn.Dropout replaced by F.dropout(x, p), whose `training` defaults to
  True -> first flagged: embeddings (the dropout after wte + wpe).
- causal mask missing: manual attention whose softmax ignores the mask -> h.0.attn.
- Conv1D weights not transposed when loading: the loader keeps HF's (in, out) layout for the square q/k/v/o
  weights (the MLP's non-square ones would fail load_state_dict by shape, so a loader that runs at all has
  this bug) -> h.0.attn; the weight round trip (HF -> ours -> HF with the right converter) flags it too.
- gelu instead of gelu_new: every MLP's activation is the exact erf GELU -> h.0.mlp.
- residual taken after the layer norm: the block computes ln_1(x) + attn(ln_1(x)) (and the same around the
  MLP) -> h.0.residual (x + attn): ln_1 and attn still match, their sum does not.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from steps.models import hf_convert
from steps.models.parity import compare
from steps.models.softmax import softmax

DROPOUT_P = 0.1


class AlwaysDropout(nn.Module):
    """The bug: F.dropout's `training` argument defaults to True, so model.eval() does not stop it."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p)  # (B, T, C), training=True whatever the module's mode


def _dropout_on(ours):
    for parent in list(ours.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Dropout):
                setattr(parent, name, AlwaysDropout(DROPOUT_P))
    return ours


def _no_causal_mask(ours):
    for block in ours.transformer.h:
        block.attn.impl = "manual"
        block.attn.softmax = lambda att, mask: softmax(att)  # (B, nh, T, T_k): every key visible
    return ours


def _gelu_exact(ours):
    for block in ours.transformer.h:
        block.mlp.act = F.gelu  # erf GELU where GPT-2 uses the tanh approximation
    return ours


def _post_ln_residual_forward(self, x, layer_past=None, use_cache=False):
    h = self.ln_1(x)  # (B, T, C)
    x = h + self.attn(h)  # the bug: the residual branch starts after ln_1
    h = self.ln_2(x)
    return h + self.mlp(h)  # (B, T, C)


def _residual_after_ln(ours):
    for block in ours.transformer.h:
        block.forward = types.MethodType(_post_ln_residual_forward, block)
    return ours


def _not_transposed_state_dict(hf) -> dict:
    sd = hf_convert.hf_to_ours_state_dict(hf.state_dict())
    for k, v in sd.items():
        if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")):
            sd[k] = v.t().contiguous()  # undo the converter's transpose: HF's Conv1D (in, out) as is
    return sd


BUGS = {  # name -> (what, expected first forward point flagged, plant on our model built right)
    "dropout_in_eval": ("dropout left on in eval (F.dropout, p=0.1)", "embeddings", _dropout_on),
    "no_causal_mask": ("causal mask missing", "h.0.attn", _no_causal_mask),
    "conv1d_not_transposed": ("Conv1D weights not transposed when loading", "h.0.attn", None),
    "gelu_not_gelu_new": ("gelu instead of gelu_new", "h.0.mlp", _gelu_exact),
    "residual_after_ln": ("residual taken after the layer norm", "h.0.residual (x + attn)", _residual_after_ln),
}


def plant(hf, bug: str):
    """Our GPT with HF GPT-2's weights and `bug` planted (a key of BUGS)."""
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known: {list(BUGS)}")
    if hf.config.activation_function != "gelu_new" and bug == "gelu_not_gelu_new":
        raise ValueError("gelu_not_gelu_new needs an HF model with activation_function='gelu_new'")
    if bug == "conv1d_not_transposed":
        return hf_convert.ours_like(hf, hf_convert.config_from_hf(hf.config), _not_transposed_state_dict(hf))
    return BUGS[bug][2](hf_convert.from_hf(hf))


def first_flagged(rows) -> dict | None:
    """The first failing forward row (rows come in forward order), None if every point passes."""
    return next((r for r in rows if r["kind"] == "forward" and not r["pass"]), None)


def catalogue_rows(hf, ids, tol, rel_tol=None, logits_tol=None, bugs=tuple(BUGS), seed: int = 0) -> list[dict]:
    """One row per bug: the first forward point the harness flags, its error and tolerance, the
    logits' error, whether the weight round trip and how many gradients were flagged."""
    out = []
    for bug in bugs:
        torch.manual_seed(seed)  # the dropout bug's masks
        hf.zero_grad(set_to_none=True)
        rows, _ = compare(hf, ids, tol, rel_tol, logits_tol, build=lambda h, b=bug: plant(h, b))
        first = first_flagged(rows)
        logits = next(r for r in rows if r["point"] == "logits")
        out.append(
            {
                "bug": bug,
                "what": BUGS[bug][0],
                "expected": BUGS[bug][1],
                "first_flagged": first["point"] if first else "none",
                "first_err": first["max_abs_err"] if first else 0.0,
                "first_tol": first["tolerance"] if first else 0.0,
                "localised": bool(first and first["point"] == BUGS[bug][1]),
                "logits_err": logits["max_abs_err"],
                "weights_flagged": not next(r for r in rows if r["kind"] == "weights")["pass"],
                "gradients_flagged": sum(r["kind"] == "gradient" and not r["pass"] for r in rows),
            }
        )
    return out
