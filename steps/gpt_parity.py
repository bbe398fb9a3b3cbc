"""gpt_parity: our GPT equals Hugging Face GPT-2, Llama or Mixtral (MoE) — weights both ways, every
layer forward, every parameter's gradient, and greedy decoding token for token.

One cell per HF config (random init, offline) or a hub checkpoint (`pretrained: gpt2`).
`hf_model` picks the class: gpt2 (GPT2LMHeadModel, hf_config = GPT2Config kwargs) or llama
(LlamaForCausalLM, hf_config = LlamaConfig kwargs: GQA, SwiGLU, RMSNorm, RoPE theta, untied head) or
mixtral (MixtralForCausalLM, MixtralConfig kwargs: Llama with a sparse MoE block per layer — router,
top-k experts, load-balancing loss added to the loss; our GPTConfig.moe, steps/models/moe.py).
Llama and Mixtral random-init cells draw the RMSNorm weights from N(1, 0.1) (HF initialises them to 1, which
would hide two swapped norms in the converter); in float64, HF Llama's float32 RMSNorm and RoPE
tables (Mixtral: also its router softmax and load-balancing loss) are lifted to float64
(llama_convert / mixtral_convert.float64_reference; fp32 compares HF as shipped).
Variants: "fast" (nn.Linear/nn.LayerNorm/SDPA, the training path) and "custom" (the
hand-written autograd Functions + manual attention).
float64: every point <= tol_fp64 (1e-10). float32, against HF as shipped: logits <= tol_fp32_logits *
max(1, |HF logits|), other points <= tol_fp32_rel * max(1, |reference|) (configs/default.yaml: both
1e-6). What is left in fp32 is rounding of two ops done differently (docs/gpt.md): GPT-2's gelu_new
(HF's tanh formula op by op, ours torch's fused F.gelu(approximate="tanh"), 1 ulp apart) and Llama's
and Mixtral's RoPE tables (HF computes the angles pos·θ in float32, ours in float64), each grown by the
following norm.
`bugs` (GPT-2 cells): the seed's bug catalogue (steps/models/parity_bugs.py), each bug planted in a copy of our
model; table `bugs` names the first forward point the harness flags and its error, per dtype (fast variant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pandas as pd
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

from steps.config.typed import Section
from steps.core import InputError, SkipCell, Stage, StageRun
from steps.models import llama_convert, mixtral_convert
from steps.models.generate import generate
from steps.models.parity import compare
from steps.models.parity_bugs import BUGS, catalogue_rows
from steps.presentation.gpt_parity import SHOWN

NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
HF_MODELS = {  # hf_model -> (config class, model class, config defaults under the cell's hf_config)
    "gpt2": (GPT2Config, GPT2LMHeadModel, {**NO_DROPOUT, "bos_token_id": None, "eos_token_id": None}),
    "llama": (LlamaConfig, LlamaForCausalLM, {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}),
    "mixtral": (MixtralConfig, MixtralForCausalLM, {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}),
}
FLOAT64_REFERENCE = {"llama": llama_convert.float64_reference, "mixtral": mixtral_convert.float64_reference}


@dataclass(frozen=True, kw_only=True)
class GptParityConfig(Section):
    """One gpt_parity cell's resolved section (defaults: workflow/schemas/gpt_parity.schema.yaml)."""

    hf_model: Literal["gpt2", "llama", "mixtral"]  # a key of HF_MODELS
    pretrained: str | None  # a hub/local checkpoint; None = random init from hf_config
    allow_cpu_pretrained: bool
    hf_config: dict  # keyword arguments of hf_model's HF config class
    init_seed: int
    dtypes: tuple[Literal["float64", "float32"], ...]
    variants: tuple[Literal["fast", "custom"], ...]
    batch_size: int
    seq_len: int
    prompt_len: int
    new_tokens: int
    tol_fp64: float
    job_threads: int  # cores its rule reserves and torch's threads (0 = the global threads)
    tol_fp32_logits: float
    tol_fp32_rel: float
    fail_on_mismatch: bool
    bugs: tuple[str, ...]  # keys of parity_bugs.BUGS planted one at a time (GPT-2 cells)


def load_hf(p: GptParityConfig, dtype):
    config_cls, model_cls, defaults = HF_MODELS[p.hf_model]
    if p.pretrained:
        try:
            hf = model_cls.from_pretrained(p.pretrained, dtype=dtype)
        except OSError as exc:
            raise InputError(
                f"gpt_parity.pretrained={p.pretrained!r} cannot be loaded ({exc}); "
                "fix: use a cell with hf_config (random init) offline"
            ) from None
    else:
        torch.manual_seed(p.init_seed)
        hf = model_cls(config_cls(**{**defaults, **p.hf_config})).to(dtype)
        if p.hf_model in FLOAT64_REFERENCE:  # RMSNorm models
            with torch.no_grad():
                for name, w in hf.named_parameters():
                    if name.endswith("norm.weight"):
                        w.normal_(1.0, 0.1)
    lift = FLOAT64_REFERENCE.get(p.hf_model) if dtype == torch.float64 else None
    return lift(hf) if lift else hf


def greedy_rows(hf, ours, prompt, n_new, dtype_name):
    ref = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=False,
        max_new_tokens=n_new,
        min_new_tokens=n_new,
        pad_token_id=0,
        eos_token_id=None,
        num_beams=1,
    )
    cached = generate(ours, prompt, n_new, use_cache=True)
    uncached = generate(ours, prompt, n_new, use_cache=False)
    return [
        {
            "kind": "generate",
            "point": f"greedy {dtype_name}, {name} vs HF generate(do_sample=False)",
            "max_abs_err": float((seq != ref).sum()),
            "ref_max_abs": float(ref.shape[1]),
            "tolerance": 0.0,
            "pass": bool(torch.equal(seq, ref)),
        }
        for name, seq in (("KV cache", cached), ("no cache", uncached))
    ]


def bug_catalogue(ctx: StageRun, p: GptParityConfig) -> dict:
    """Each of p.bugs planted in a copy of our model, per dtype: the first point flagged, by how much."""
    rows = []
    for dtype_name in p.dtypes:
        hf = load_hf(p, getattr(torch, dtype_name)).to(ctx.device).eval()
        T = min(p.seq_len, hf.config.max_position_embeddings)
        ids = torch.randint(
            0, hf.config.vocab_size, (p.batch_size, T), generator=torch.Generator().manual_seed(ctx.seed)
        )
        fp64 = dtype_name == "float64"
        tols = (p.tol_fp64, None, p.tol_fp64) if fp64 else (p.tol_fp64, p.tol_fp32_rel, p.tol_fp32_logits)
        rows += [
            {"dtype": dtype_name, **r}
            for r in catalogue_rows(hf, ids.to(ctx.device), *tols, bugs=p.bugs, seed=ctx.seed)
        ]
    df = pd.DataFrame(rows)
    ctx.log_table(df, "bugs")
    out = {"bugs_localised": float(df.localised.mean())}
    for r in df.itertuples():
        out[f"bug_{r.bug}_{r.dtype}_err"] = r.first_err
    ctx.info["bugs"] = {f"{r.bug} {r.dtype}": r.first_flagged for r in df.itertuples()}
    missed = [f"{r.bug} {r.dtype}: {r.first_flagged} (expected {r.expected})" for r in df[~df.localised].itertuples()]
    if missed and p.fail_on_mismatch:
        raise AssertionError(f"bug catalogue: harness did not name the expected point for {missed}")
    return out


def run(ctx: StageRun) -> dict:
    p = GptParityConfig.of(ctx.params)
    if p.bugs and (p.hf_model != "gpt2" or p.pretrained or any(b not in BUGS for b in p.bugs)):
        raise InputError(
            f"gpt_parity.bugs={list(p.bugs)}: known bugs {list(BUGS)}, on random-init hf_model gpt2 cells only; "
            "fix: drop `bugs` from this cell"
        )
    ctx.use_threads(p.job_threads)
    device = ctx.device
    if p.pretrained and device.type != "cuda" and not p.allow_cpu_pretrained:
        raise SkipCell("skipped: pretrained checkpoint cell runs on CUDA (set allow_cpu_pretrained)")
    rows = []
    for dtype_name in p.dtypes:
        dtype = getattr(torch, dtype_name)
        hf = load_hf(p, dtype).to(device).eval()
        g = torch.Generator().manual_seed(ctx.seed)
        V, n_pos = hf.config.vocab_size, hf.config.max_position_embeddings
        T = min(p.seq_len, n_pos)
        ids = torch.randint(0, V, (p.batch_size, T), generator=g).to(device)
        fp64 = dtype == torch.float64
        for variant in p.variants:
            hf.zero_grad(set_to_none=True)
            r, ours = compare(
                hf,
                ids,
                p.tol_fp64,
                None if fp64 else p.tol_fp32_rel,
                p.tol_fp64 if fp64 else p.tol_fp32_logits,
                custom=variant == "custom",
            )
            prompt = ids[:, : min(p.prompt_len, n_pos - p.new_tokens)]
            r += greedy_rows(hf, ours, prompt, p.new_tokens, dtype_name)
            rows += [{"dtype": dtype_name, "variant": variant, **x} for x in r]
        cfg_name = HF_MODELS[p.hf_model][0].__name__
        ctx.info["model"] = p.pretrained or f"{cfg_name}(" + ", ".join(f"{k}={v}" for k, v in p.hf_config.items()) + ")"
        n_params = ours.num_params(non_embedding=False)
    df = pd.DataFrame(rows)
    ctx.log_table(df, "parity")
    out = {"n_params": n_params, "all_pass": float(df["pass"].all()), "n_checks": len(df)}
    for (dt, kind), grp in df.groupby(["dtype", "kind"]):  # worst over both variants
        out[f"{dt}_{kind}_max_err"] = float(grp.max_abs_err.max())
    for dt, grp in df[df.point == "logits"].groupby("dtype"):
        out[f"{dt}_logits_err"] = float(grp.max_abs_err.max())
    gen = df[df.kind == "generate"]
    out["greedy_match"] = float(gen["pass"].all())
    ctx.info["failed"] = [f"{r.dtype} {r.variant} {r.point}" for r in df[~df["pass"]].itertuples()]
    if ctx.info["failed"] and p.fail_on_mismatch:
        raise AssertionError(f"parity failed at {ctx.info['failed'][:10]}")
    return out | (bug_catalogue(ctx, p) if p.bugs else {})


STAGE = Stage.of(__spec__.name, run, SHOWN)

if __name__ == "__main__":
    STAGE.main()
