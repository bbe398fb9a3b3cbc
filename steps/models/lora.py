"""LoRA by hand (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"; the HF guide's
PEFT section): a frozen nn.Linear W plus a trainable low-rank update, y = x W^T + b + s · B(A(dropout(x)))
with A (r, in), B (out, r), s = alpha / r. A starts Kaiming-uniform (a=√5, nn.Linear's default), B at
zero, so the adapted model starts equal to the base one (peft's default init, init_lora_weights=True).

apply_lora(model, r, alpha, targets) swaps every nn.Linear whose name ends with a target for a
LoRALinear sharing its weight and bias, and freezes every parameter but the adapters'. Names follow
peft (`<module>.lora_A.weight`, `<module>.lora_B.weight`; peft adds an adapter name, `.default`).

Checked against peft on HF GPT-2 (tests/test_lora.py): the same A and B give the same logits and the
same adapter gradients, by name. HF GPT-2's attention fuses q/k/v into one Conv1D c_attn, where peft's
LoRA shares one A among the three; ours keeps them apart (a different low-rank family), so parity targets
the modules both sides have one to one: attn.o_proj (HF attn.c_proj), mlp.c_fc, mlp.c_proj.

Optimizer state (AdamW: exp_avg and exp_avg_sq, one of each per trainable element, + a step count per
tensor): 2 · trainable · bytes per element; LoRA on a (out, in) matrix trains r · (in + out) elements.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LoRALinear(nn.Linear):
    """A frozen nn.Linear (the same weight and bias tensors) plus s · B A."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0):
        nn.Module.__init__(self)
        if r < 1:
            raise ValueError(f"LoRA rank r={r} must be >= 1")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias  # shared with the base model, frozen by apply_lora
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(self.in_features, r, bias=False, **kw)  # (r, in)
        self.lora_B = nn.Linear(r, self.out_features, bias=False, **kw)  # (out, r)
        self.lora_dropout = nn.Dropout(dropout)
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x):  # x: (..., in)
        delta = self.lora_B(self.lora_A(self.lora_dropout(x)))  # (..., r) -> (..., out)
        return F.linear(x, self.weight, self.bias) + self.scaling * delta  # (..., out)

    def merged_weight(self) -> torch.Tensor:
        """W + s · B A (out, in): the plain Linear that computes the same function (dropout 0)."""
        return self.weight + self.scaling * self.lora_B.weight @ self.lora_A.weight


def apply_lora(model: nn.Module, r: int, alpha: float, targets, dropout: float = 0.0) -> list[str]:
    """In place: LoRA on every nn.Linear whose name ends with one of `targets`; every other parameter
    frozen. Returns the adapted modules' names; ValueError if no module matches."""
    names = [n for n, m in model.named_modules() if type(m) is nn.Linear and n.endswith(tuple(targets))]
    if not names:
        raise ValueError(f"lora.targets={list(targets)} match no nn.Linear of the model")
    for p in model.parameters():
        p.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(getattr(parent, child), r, alpha, dropout))
    return names


def merge_lora(model: nn.Module) -> nn.Module:
    """In place: every LoRALinear back to a plain nn.Linear holding W + s · B A (the same function with
    dropout 0); its parameters trainable again, as in the base model."""
    for name, m in list(model.named_modules()):
        if isinstance(m, LoRALinear):
            parent_name, _, child = name.rpartition(".")
            kw = {"device": m.weight.device, "dtype": m.weight.dtype}
            plain = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, **kw)
            with torch.no_grad():
                plain.weight.copy_(m.merged_weight())
                if m.bias is not None:
                    plain.bias.copy_(m.bias)
            setattr(model.get_submodule(parent_name), child, plain)
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def trainable_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def optimizer_state_bytes(state: dict) -> int:
    """Bytes of every tensor in an optimizer's state (`opt.state`, or a saved `state_dict()["state"]`),
    measured: AdamW's exp_avg, exp_avg_sq and step."""
    return sum(t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t))


def adamw_state_bytes_analytic(model: nn.Module) -> int:
    """AdamW's state from the trainable parameters alone: 2 moments per element (the parameters'
    dtype) + one float32 step count per tensor."""
    return sum(2 * p.numel() * p.element_size() + 4 for p in model.parameters() if p.requires_grad)
