"""Layer-by-layer comparison of our GPT with HF GPT2LMHeadModel, LlamaForCausalLM or MixtralForCausalLM
on the same weights.

Forward hooks on corresponding modules (HF GPT-2's names are ours; Llama's and Mixtral's come from
llama_convert / mixtral_convert.HF_MODULES) record embeddings, each block's ln_1 / attn / residual /
ln_2 / mlp (Mixtral: also the router logits) / output (the hidden state after each layer), ln_f and
logits, and Mixtral's load-balancing loss; then one loss (CE + coef · aux) is back-propagated in
both and every parameter's gradient is compared after converting HF's gradients with the same
function that converts its weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from steps.models import hf_convert, llama_convert, mixtral_convert
from steps.models.gpt import use_custom_functions

OUR_MODULES = {  # also HF GPT-2's names
    "ln_1": "transformer.h.{i}.ln_1",
    "attn": "transformer.h.{i}.attn",
    "ln_2": "transformer.h.{i}.ln_2",
    "mlp": "transformer.h.{i}.mlp",
    "block": "transformer.h.{i}",
    "ln_f": "transformer.ln_f",
    "router": "transformer.h.{i}.mlp.gate",  # MoE only (recorded where the model has one)
}
CONVERTERS = {
    "gpt2": hf_convert,
    "llama": llama_convert,
    "mixtral": mixtral_convert,
}  # HF config.model_type -> converter module


def converter(hf):
    kind = hf.config.model_type
    if kind not in CONVERTERS:
        raise ValueError(f"no converter for HF model_type {kind!r}; known: {list(CONVERTERS)}")
    return CONVERTERS[kind]


def _first(t):
    return t[0] if isinstance(t, tuple) else t


def record_activations(model, n_layer: int, modules: dict = OUR_MODULES) -> tuple[dict, list]:
    """Hooks filling {point name: tensor}; `modules` names each point's module in `model`."""
    acts, handles = {}, []
    mods = dict(model.named_modules())

    def save(name, use_input=False):
        def hook(mod, inp, out):
            acts[name] = (inp[0] if use_input else _first(out)).detach()

        return hook

    def at(point, i, name, use_input=False):
        handles.append(mods[modules[point].format(i=i)].register_forward_hook(save(name, use_input)))

    for i in range(n_layer):
        if i == 0:
            at("ln_1", i, "embeddings", True)
        at("ln_1", i, f"h.{i}.ln_1")
        at("attn", i, f"h.{i}.attn")
        at("ln_2", i, f"h.{i}.residual (x + attn)", True)
        at("ln_2", i, f"h.{i}.ln_2")
        if "router" in modules and modules["router"].format(i=i) in mods:
            at("router", i, f"h.{i}.router logits")
        at("mlp", i, f"h.{i}.mlp")
        at("block", i, f"h.{i}.out")
    at("ln_f", 0, "ln_f")
    return acts, handles


def reference_loss(logits, labels, ignore_index: int = -100, **_):
    """Next-token cross-entropy by slicing (logits[:, :-1] scored against labels[:, 1:]), softmax in
    fp32, or in fp64 for fp64 logits. An independent formulation of our label-shifting loss."""
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=ignore_index
    )


def float64_loss(hf):
    """In place: the HF model's loss through reference_loss. HF's ForCausalLMLoss casts logits to
    float32 first, so a float64 HF model's loss (and every gradient below it) carries float32 rounding
    (~1e-7); a float64 reference must not."""
    hf.loss_function = reference_loss
    return hf


def _err(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max())


def compare(
    hf, ids, tol: float, rel_tol: float | None = None, logits_tol: float | None = None, custom: bool = False, build=None
):
    """Rows (kind, point, max_abs_err, ref_max_abs, tolerance, pass) for one dtype.
    With rel_tol (fp32), a point's tolerance is rel_tol * max(1, |reference|max), the logits'
    logits_tol * max(1, |logits|max): fp32 rounding error grows with magnitude (GPT-2's residual
    stream reaches the thousands, a pretrained model's logits the hundreds). Without it (fp64) every
    point's tolerance is `tol`, the logits' `logits_tol`, both absolute.
    custom=True swaps in the hand-written autograd Functions and manual attention. build(hf) -> our model
    replaces the converter's from_hf (parity_bugs plants a bug in the copy it builds)."""
    conv = converter(hf)
    ours = (build or conv.from_hf)(hf)
    if next(hf.parameters()).dtype == torch.float64:
        float64_loss(hf)
    if custom:
        use_custom_functions(ours)
    hf.eval(), ours.eval()
    n_layer = hf.config.num_hidden_layers
    rows = []

    def add(kind, point, a, b, abs_tol=None, rel=rel_tol):
        ref = float(b.detach().double().abs().max())
        t = abs_tol if abs_tol is not None else (tol if rel is None else rel * max(1.0, ref))
        e = _err(a, b)
        rows.append(
            {"kind": kind, "point": point, "max_abs_err": e, "ref_max_abs": ref, "tolerance": t, "pass": bool(e <= t)}
        )

    back = conv.ours_to_hf_state_dict(ours.state_dict())
    sd = hf.state_dict()
    add(
        "weights",
        "HF -> ours -> HF state dict",
        torch.stack([_err(back[k], sd[k]) * torch.ones(()) for k in back]),
        torch.zeros(len(back)),
        0.0,
    )

    hf_modules = getattr(conv, "HF_MODULES", OUR_MODULES)
    (a_h, h_h), (a_o, h_o) = record_activations(hf, n_layer, hf_modules), record_activations(ours, n_layer)
    out_h, out_o = hf(ids, labels=ids, **getattr(conv, "HF_FORWARD_KWARGS", {})), ours(ids, labels=ids)
    for h in h_h + h_o:
        h.remove()
    for name in a_h:
        add("forward", name, a_o[name], a_h[name])
    if rel_tol is None:
        add("forward", "logits", out_o.logits, out_h.logits, logits_tol)
    else:
        add("forward", "logits", out_o.logits, out_h.logits, rel=logits_tol)
    if getattr(out_h, "aux_loss", None) is not None:
        add("forward", "load-balancing loss", out_o.aux_loss, out_h.aux_loss)
    add("forward", "loss (HF shift)", out_o.loss, out_h.loss)

    out_h.loss.backward()
    out_o.loss.backward()
    g_hf = conv.hf_to_ours_state_dict({k: p.grad for k, p in hf.named_parameters()})
    for k, p in ours.named_parameters():
        add("gradient", k, p.grad, g_hf[k])
    return rows, ours
