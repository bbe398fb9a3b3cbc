"""fp8 matmuls (steps/models/fp8.py): torch._scaled_mm (it runs on CPU too) against the same
per-tensor e4m3/e5m2 quantisation done by hand in fp32, and against the fp32 Linear at fp8's
precision."""

from __future__ import annotations

import torch
from torch import nn

from steps.models.fp8 import E4M3, E5M2, Fp8Linear, convert_to_fp8, quantize

torch.set_num_threads(1)


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def deq(t, dtype):
    q, inv = quantize(t, dtype)
    return q.float() * inv


def test_quantize_uses_the_format_range_and_round_trips():
    t = torch.randn(64, 32) * 1e-3
    for dtype in (E4M3, E5M2):
        q, inv = quantize(t, dtype)
        assert q.dtype == dtype and float(q.float().abs().max()) == torch.finfo(dtype).max
        assert rel(q.float() * inv, t) < (0.05 if dtype == E4M3 else 0.1)


def test_fp8_linear_equals_hand_quantised_matmuls_forward_and_backward():
    torch.manual_seed(0)
    lin = Fp8Linear(64, 48)
    x = torch.randn(2, 16, 64, requires_grad=True)
    y = lin(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    x2, w = x.detach().reshape(-1, 64), lin.weight.detach()
    y_ref = deq(x2, E4M3) @ deq(w, E4M3).t() + lin.bias.detach()
    g = deq(gy.reshape(-1, 48), E5M2)
    assert rel(y.reshape(-1, 48), y_ref) < 1e-5
    assert rel(x.grad.reshape(-1, 64), g @ deq(w, E4M3)) < 1e-5
    assert rel(lin.weight.grad, g.t() @ deq(x2, E4M3)) < 1e-5
    assert torch.allclose(lin.bias.grad, gy.reshape(-1, 48).sum(0))


def test_fp8_linear_is_close_to_the_fp32_linear():
    torch.manual_seed(1)
    ref, f8 = nn.Linear(128, 96), Fp8Linear(128, 96)
    f8.load_state_dict(ref.state_dict())
    x = torch.randn(64, 128)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ref(xa), f8(xb)
    gy = torch.randn_like(ya)
    ya.backward(gy), yb.backward(gy)
    assert 0 < rel(yb, ya) < 0.08  # e4m3: 3 mantissa bits
    assert 0 < rel(xb.grad, xa.grad) < 0.15  # e5m2 gradients: 2 mantissa bits
    assert 0 < rel(f8.weight.grad, ref.weight.grad) < 0.15


def test_fp8_under_bf16_autocast_returns_bf16():
    f8 = Fp8Linear(32, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert f8(torch.randn(4, 32)).dtype == torch.bfloat16
    assert f8(torch.randn(4, 32)).dtype == torch.float32


def test_gpt_with_fp8_blocks_trains():
    from steps.models.gpt import GPTConfig, GPTLMHeadModel
    from steps.models.train_step import StepOptions, TrainStep

    torch.manual_seed(0)
    m = GPTLMHeadModel(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    assert convert_to_fp8(m) == 2 * 6  # q, k, v, o, c_fc, c_proj per block; the head stays
    assert type(m.lm_head) is nn.Linear
    ts = TrainStep(m, torch.device("cpu"), StepOptions(lr=3e-3))
    x = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(0))
    losses = [ts.step([x])[0] for _ in range(15)]
    assert losses[-1] < losses[0] - 0.3, losses
