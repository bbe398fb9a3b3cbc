"""Our hand-written LoRA (steps/models/lora.py) == peft's on HF GPT-2: the same adapter weights give
the same logits and the same adapter gradients by name; the init law, freezing and state bytes."""

import math

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

from steps.models.hf_convert import from_hf
from steps.models.lora import (
    LoRALinear,
    adamw_state_bytes_analytic,
    apply_lora,
    optimizer_state_bytes,
    trainable_params,
)
from steps.models.parity import reference_loss

torch.set_num_threads(1)
CFG = dict(vocab_size=120, n_positions=32, n_embd=32, n_layer=2, n_head=4)
OURS_TARGETS = ("attn.o_proj", "mlp.c_fc", "mlp.c_proj")
PEFT_TARGETS = ["attn.c_proj", "mlp.c_fc", "mlp.c_proj"]  # HF names of the same modules (Conv1D)
R, ALPHA = 4, 8.0


def pair(dtype=torch.float64):
    """HF GPT-2 under peft LoRA and ours with LoRA, same base weights; B randomised (same on both) so
    the adapters change the function and A gets gradients (B = 0 at init would hide a wrong A)."""
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(
        GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, **CFG)
    ).to(dtype)
    ours, base = from_hf(hf), from_hf(hf).eval()
    peft_model = get_peft_model(
        hf,
        LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=PEFT_TARGETS, fan_in_fan_out=True),
    )
    names = apply_lora(ours, R, ALPHA, OURS_TARGETS)
    pm = dict(peft_model.named_parameters())
    with torch.no_grad():
        for n, p in ours.named_parameters():
            if "lora_" in n:
                q = pm[peft_name(n)]
                if "lora_B" in n:
                    q.normal_(0.0, 0.3)
                p.copy_(q)
    return peft_model.eval(), ours.eval(), names, base


def peft_name(ours_name: str) -> str:
    """h.0.attn.o_proj.lora_A.weight (ours) -> base_model.model.h.0.attn.c_proj.lora_A.default.weight (peft)"""
    n = ours_name.replace("attn.o_proj", "attn.c_proj")
    for ab in ("lora_A", "lora_B"):
        n = n.replace(f"{ab}.weight", f"{ab}.default.weight")
    return f"base_model.model.{n}"


def test_forward_and_adapter_gradients_equal_peft():
    peft_model, ours, names, base = pair()
    assert len(names) == 3 * CFG["n_layer"]
    ids = torch.randint(0, CFG["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    lo, lp = ours(ids).logits, peft_model(input_ids=ids).logits
    assert (lo - lp).abs().max() <= 1e-12
    with peft_model.disable_adapter():
        assert (base(ids).logits - peft_model(input_ids=ids).logits).abs().max() <= 1e-12
    assert (base(ids).logits - lo).abs().max() > 1e-3  # the adapters matter
    reference_loss(lo, ids).backward()
    reference_loss(lp, ids).backward()
    pg = {n: p.grad for n, p in peft_model.named_parameters() if p.requires_grad}
    og = {n: p.grad for n, p in ours.named_parameters() if p.requires_grad}
    assert {peft_name(n) for n in og} == set(pg) and len(og) == 2 * len(names)
    for n, g in og.items():
        assert g.abs().max() > 0, n
        assert (g - pg[peft_name(n)]).abs().max() <= 1e-12 * max(1.0, float(g.abs().max())), n


def test_trainable_parameters_equal_peft_and_the_formula():
    peft_model, ours, *_ = pair()
    n = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    d, L = CFG["n_embd"], CFG["n_layer"]
    formula = L * R * ((d + d) + (d + 4 * d) + (4 * d + d))  # r·(in + out) per adapted matrix
    assert trainable_params(ours) == n == formula
    assert all(not p.requires_grad for name, p in ours.named_parameters() if "lora_" not in name)


def test_init_starts_at_the_base_model_and_merges():
    torch.manual_seed(0)
    base = torch.nn.Linear(64, 48).double()
    lora = LoRALinear(base, r=8, alpha=16)
    x = torch.randn(3, 64, dtype=torch.float64)
    assert torch.equal(lora(x), base(x))  # B = 0
    bound = 1 / math.sqrt(64)  # kaiming_uniform(a=√5) on fan_in 64, as nn.Linear and peft
    assert 0.9 * bound < lora.lora_A.weight.abs().max() <= bound and not lora.lora_B.weight.any()
    with torch.no_grad():
        lora.lora_B.weight.normal_()
    assert torch.allclose(lora(x), x @ lora.merged_weight().T + base.bias, atol=1e-12)


def test_optimizer_state_bytes_measured_equal_analytic():
    _, ours, *_ = pair(torch.float32)
    opt = torch.optim.AdamW([p for p in ours.parameters() if p.requires_grad])
    ids = torch.randint(0, CFG["vocab_size"], (2, 12))
    ours.train()
    reference_loss(ours(ids).logits, ids).backward()
    opt.step()
    assert (
        optimizer_state_bytes(opt.state) == adamw_state_bytes_analytic(ours) == 2 * 4 * trainable_params(ours) + 4 * 12
    )


def test_no_matching_target_is_a_clear_error():
    _, ours, *_ = pair()
    with pytest.raises(ValueError, match="match no nn.Linear"):
        apply_lora(ours, 2, 4, ("nonexistent",))
