"""fp8 training matmuls: a Linear whose three GEMMs run in 8-bit floats through torch._scaled_mm
(the cuBLASLt fp8 path on Hopper/Ada tensor cores: 2× the bf16 rate on an H100).

Recipe (per-tensor dynamic scaling, the "tensorwise" recipe of torchao.float8):
  forward   y      = x  @ wᵀ      x, w quantised to e4m3 (more mantissa: values)
  backward  grad_x = gy @ w       gy quantised to e5m2 (more range: gradients), w e4m3
            grad_w = gyᵀ @ x      gy e5m2, x e4m3
Each tensor is scaled so its absolute max lands on the format's largest finite value, cast,
and the matmul gets the inverse scales to undo it: y = (x8 · sx⁻¹) @ (w8 · sw⁻¹)ᵀ.
Master weights, optimizer state and the output stay in high precision (bf16 under autocast,
else the input's dtype); only the GEMM inputs are fp8.

_scaled_mm wants its first operand row-major and its second column-major, and (on CUDA)
every dimension a multiple of 16. It also runs on CPU (slowly), which the tests use for parity
against the same quantisation done by hand in fp32.
"""

from __future__ import annotations

import torch
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def quantize(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 tensor, inverse scale): t ≈ fp8.float() * inverse scale."""
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (t.float() * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype), scale.reciprocal()


def col_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix laid out column-major (what _scaled_mm needs as its second operand)."""
    return t.t().contiguous().t()


def scaled_mm(a8, sa, b8, sb, out_dtype) -> torch.Tensor:
    return torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


class Fp8Matmul(torch.autograd.Function):
    """x (N, in) @ w (out, in)ᵀ with fp8 GEMMs forward and backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        x8, sx = quantize(x, E4M3)
        w8, sw = quantize(w, E4M3)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.dtypes = (x.dtype, w.dtype)
        return scaled_mm(x8, sx, w8.t(), sw, out_dtype)  # (N, in) @ (in, out)

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = quantize(gy, E5M2)
        grad_x = scaled_mm(g8, sg, col_major(w8), sw, torch.float32)  # (N, out) @ (out, in)
        grad_w = scaled_mm(g8.t().contiguous(), sg, col_major(x8), sx, torch.float32)  # (out, N) @ (N, in)
        return grad_x.to(ctx.dtypes[0]), grad_w.to(ctx.dtypes[1]), None


class Fp8Linear(nn.Linear):
    """nn.Linear with fp8 GEMMs; same parameters and state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        with torch.autocast(x.device.type, enabled=False):
            y = Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight, out_dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y + self.bias.to(y.dtype) if self.bias is not None else y


def convert_to_fp8(model: nn.Module) -> int:
    """Swap the transformer blocks' Linears for Fp8Linear in place (the LM head stays in high
    precision, as torchao and llm.c do: its logits feed the loss). Returns how many."""
    n = 0
    for block in model.transformer.h:
        for m in block.modules():
            if type(m) is nn.Linear:
                m.__class__ = Fp8Linear
                n += 1
    return n
