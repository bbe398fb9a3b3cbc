"""Layer-by-layer comparison of our GPT with HF GPT2LMHeadModel on the same weights.

Forward hooks on modules with the same name in both models (the point of HF-like naming)
record embeddings, each block's ln_1 / attn / residual / ln_2 / mlp / output, ln_f and logits;
then one loss is back-propagated in both and every parameter's gradient is compared after
converting HF's gradients with the same function that converts its weights.
"""

from __future__ import annotations

import torch

from steps.models.gpt import use_custom_functions
from steps.models.hf_convert import from_hf, hf_to_ours_state_dict, ours_to_hf_state_dict


def _first(t):
    return t[0] if isinstance(t, tuple) else t


def record_activations(model, n_layer: int) -> tuple[dict, list]:
    """Hooks filling {point name: tensor}; the same names exist in HF GPT-2 and ours."""
    acts, handles = {}, []
    mods = dict(model.named_modules())

    def save(name, use_input=False):
        def hook(mod, inp, out):
            acts[name] = (inp[0] if use_input else _first(out)).detach()

        return hook

    for i in range(n_layer):
        p = f"transformer.h.{i}"
        if i == 0:
            handles.append(mods[f"{p}.ln_1"].register_forward_hook(save("embeddings", True)))
        handles.append(mods[f"{p}.ln_1"].register_forward_hook(save(f"h.{i}.ln_1")))
        handles.append(mods[f"{p}.attn"].register_forward_hook(save(f"h.{i}.attn")))
        handles.append(mods[f"{p}.ln_2"].register_forward_hook(save(f"h.{i}.residual (x + attn)", True)))
        handles.append(mods[f"{p}.ln_2"].register_forward_hook(save(f"h.{i}.ln_2")))
        handles.append(mods[f"{p}.mlp"].register_forward_hook(save(f"h.{i}.mlp")))
        handles.append(mods[p].register_forward_hook(save(f"h.{i}.out")))
    handles.append(mods["transformer.ln_f"].register_forward_hook(save("ln_f")))
    return acts, handles


def _err(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max())


def compare(hf, ids, tol: float, rel_tol: float | None = None, logits_tol: float | None = None, custom: bool = False):
    """Rows (kind, point, max_abs_err, ref_max_abs, tolerance, pass) for one dtype.
    With rel_tol (fp32), a point's tolerance is rel_tol * max(1, |reference|max): fp32 rounding
    error grows with magnitude (GPT-2's residual stream reaches the thousands).
    custom=True swaps in the hand-written autograd Functions and manual attention."""
    ours = from_hf(hf)
    if custom:
        use_custom_functions(ours)
    hf.eval(), ours.eval()
    n_layer = hf.config.n_layer
    rows = []

    def add(kind, point, a, b, abs_tol=None):
        ref = float(b.detach().double().abs().max())
        t = abs_tol if abs_tol is not None else (tol if rel_tol is None else rel_tol * max(1.0, ref))
        e = _err(a, b)
        rows.append(
            {"kind": kind, "point": point, "max_abs_err": e, "ref_max_abs": ref, "tolerance": t, "pass": bool(e <= t)}
        )

    back = ours_to_hf_state_dict(ours.state_dict())
    sd = hf.state_dict()
    add(
        "weights",
        "HF -> ours -> HF state dict",
        torch.stack([_err(back[k], sd[k]) * torch.ones(()) for k in back]),
        torch.zeros(len(back)),
        0.0,
    )

    (a_h, h_h), (a_o, h_o) = record_activations(hf, n_layer), record_activations(ours, n_layer)
    out_h, out_o = hf(ids, labels=ids), ours(ids, labels=ids)
    for h in h_h + h_o:
        h.remove()
    for name in a_h:
        add("forward", name, a_o[name], a_h[name])
    add("forward", "logits", out_o.logits, out_h.logits, logits_tol)
    add("forward", "loss (HF shift)", out_o.loss, out_h.loss)

    out_h.loss.backward()
    out_o.loss.backward()
    g_hf = hf_to_ours_state_dict({k: p.grad for k, p in hf.named_parameters()})
    for k, p in ours.named_parameters():
        add("gradient", k, p.grad, g_hf[k])
    return rows, ours
