"""steps.models.chunked_ce: chunked linear + cross-entropy equals F.cross_entropy (values and
gradients) and never holds the (N, V) logits; the GPTConfig.fused_ce hook. CPU, a few seconds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from steps.models.chunked_ce import default_chunk_size, linear_cross_entropy, reference_linear_cross_entropy


def make_inputs(n=150, v=97, d=24, dtype=torch.float64, ignore_every=7, ignore_index=-100, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=gen).to(dtype)
    w = (0.5 * torch.randn(v, d, generator=gen)).to(dtype)
    t = torch.randint(0, v, (n,), generator=gen)
    t[::ignore_every] = ignore_index
    return h, w, t


def loss_and_grads(fn, h, w, t, scale=1.0, **kw):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fn(h, w, t, **kw)
    (loss * scale).backward()
    return loss.detach(), h.grad, w.grad


def rel_err(a, b) -> float:
    """max |a - b| over max |b| (gradients are O(1/N): judge them against their own scale)."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


# ---- 1. fp64: exact up to rounding ------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 7, 64, 100, 150, 1000, None])
def test_fp64_equals_reference(chunk):
    """Loss, dL/dh and dL/dW within 1e-12 absolute (rtol 0) of F.cross_entropy, chunk sizes that
    divide N = 150 and ones that do not; every 7th target ignored; upstream gradient 3.5."""
    h, w, t = make_inputs()
    ours = loss_and_grads(linear_cross_entropy, h, w, t, scale=3.5, chunk_size=chunk)
    ref = loss_and_grads(reference_linear_cross_entropy, h, w, t, scale=3.5)
    for a, b in zip(ours, ref):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert (ours[1][t == -100] == 0).all()  # ignored rows get no gradient


def test_fp64_other_ignore_index_and_no_grad():
    h, w, t = make_inputs(ignore_index=3)  # a real class id as ignore_index
    ours = loss_and_grads(linear_cross_entropy, h, w, t, chunk_size=16, ignore_index=3)
    ref = loss_and_grads(reference_linear_cross_entropy, h, w, t, ignore_index=3)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    with torch.no_grad():  # loss-only path (no gradient work)
        torch.testing.assert_close(linear_cross_entropy(h, w, t, 3, chunk_size=16), ref[0], rtol=0, atol=1e-12)


def test_all_ignored_matches_cross_entropy():
    """Mean over zero targets: nan loss (as F.cross_entropy), zero gradients."""
    h, w, t = make_inputs(n=20)
    t[:] = -100
    loss, gh, gw = loss_and_grads(linear_cross_entropy, h, w, t, chunk_size=8)
    rloss, rgh, rgw = loss_and_grads(reference_linear_cross_entropy, h, w, t)
    assert torch.isnan(loss) and torch.isnan(rloss)
    assert (gh == 0).all() and (gw == 0).all() and (rgh == 0).all() and (rgw == 0).all()


def test_tied_weight_and_frozen_weight():
    """W also used as an embedding: its grad is the sum of both uses. W frozen: no grad for it,
    dL/dh still exact."""
    h, w, t = make_inputs()
    ids = torch.randint(0, w.shape[0], (10,), generator=torch.Generator().manual_seed(1))
    grads = []
    for fn in (lambda *a: linear_cross_entropy(*a, chunk_size=33), reference_linear_cross_entropy):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        emb = F.embedding(ids, ww)  # the tied input embedding
        (fn(hh + emb.sum() * 1e-3, ww, t) + emb.pow(2).sum()).backward()
        grads.append((hh.grad, ww.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)

    hh = h.clone().requires_grad_()
    linear_cross_entropy(hh, w, t, chunk_size=33).backward()  # w.requires_grad is False
    hr = h.clone().requires_grad_()
    reference_linear_cross_entropy(hr, w, t).backward()
    assert w.grad is None
    torch.testing.assert_close(hh.grad, hr.grad, rtol=0, atol=1e-12)


def test_3d_inputs_and_default_chunk():
    h, w, t = make_inputs(n=2 * 75)
    ours = loss_and_grads(linear_cross_entropy, h.view(2, 75, -1), w, t.view(2, 75))
    ref = loss_and_grads(reference_linear_cross_entropy, h, w, t)
    torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(ours[1].view(150, -1), ref[1], rtol=0, atol=1e-12)
    assert default_chunk_size(10**6, 8192) == 512  # 16 MiB of fp32 logits per chunk
    assert default_chunk_size(10**6, 4096) == 1024
    assert default_chunk_size(10**6, 50257) == 256  # the floor: 64 from the budget alone
    assert default_chunk_size(100, 8192) == 100  # never more than N


# ---- 2. fp32 and bf16 autocast ----------------------------------------------------------------
def test_fp32_close_to_reference():
    """fp32: loss within 1e-6 relative, gradients within 1e-5 of their max magnitude."""
    h, w, t = make_inputs(n=300, v=500, d=32, dtype=torch.float32)
    ours = loss_and_grads(linear_cross_entropy, h, w, t, chunk_size=64)
    ref = loss_and_grads(reference_linear_cross_entropy, h, w, t)
    exact = loss_and_grads(reference_linear_cross_entropy, h.double(), w.double(), t)
    assert all(a.dtype == torch.float32 for a in ours)
    assert rel_err(ours[0], exact[0]) < 1e-6 and rel_err(ref[0], exact[0]) < 1e-6
    for a, b in zip(ours[1:], exact[1:]):
        assert rel_err(a, b) < 1e-5


class OpLog(TorchDispatchMode):
    """Every aten op run inside: (name, input float dtypes); and the largest tensor created."""

    def __init__(self):
        super().__init__()
        self.ops, self.largest = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [
            a.dtype for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor) and a.is_floating_point()
        ]
        self.ops.append((func.__name__, ins))
        for o in tree_flatten(out)[0]:
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel())
        return out


def test_bf16_autocast_cpu():
    """Under CPU bf16 autocast: matmuls in bf16, logsumexp in fp32, gradients in the inputs'
    fp32; loss within 1e-2 and gradients within 2e-2 (relative) of the fp64 truth, no worse than
    the unfused reference under the same autocast (2x its error + slack)."""
    h, w, t = make_inputs(n=96, v=256, d=32, dtype=torch.float32)
    exact = loss_and_grads(reference_linear_cross_entropy, h.double(), w.double(), t)
    with torch.autocast("cpu", dtype=torch.bfloat16), OpLog() as log:
        ours = loss_and_grads(linear_cross_entropy, h, w, t, chunk_size=40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = loss_and_grads(reference_linear_cross_entropy, h, w, t)
    assert [a.dtype for a in ours] == [torch.float32] * 3
    mms = [ins for name, ins in log.ops if name.split(".")[0] in ("mm", "addmm", "bmm")]
    assert mms and all(set(ins) == {torch.bfloat16} for ins in mms), mms
    assert any(name.startswith("logsumexp") and ins == [torch.float32] for name, ins in log.ops)
    for a, r, x, tol in zip(ours, ref, exact, (1e-2, 2e-2, 2e-2)):
        assert rel_err(a, x) < tol
        assert rel_err(a, x) < 2 * rel_err(r, x) + 1e-3


# ---- 3. memory: the full logits never exist ---------------------------------------------------
N, V, D, CHUNK = 512, 4096, 64, 128  # full fp32 logits: 8 MiB; one chunk: 2 MiB


def saved_during(fn, h, w, t):
    """Forward + backward; the tensors autograd saved (numel, bytes of distinct storages)."""
    saved = {}

    def pack(x):
        saved[x.untyped_storage().data_ptr()] = (x.numel(), x.untyped_storage().nbytes())
        return x

    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = fn(h, w, t)
    loss.backward()
    return list(saved.values())


@pytest.fixture(scope="module")
def toy():
    return make_inputs(n=N, v=V, d=D, dtype=torch.float32)


def test_saved_tensors_never_full_logits(toy):
    ours = saved_during(lambda *a: linear_cross_entropy(*a, chunk_size=CHUNK), *toy)
    ref = saved_during(reference_linear_cross_entropy, *toy)
    full = N * V
    # the reference saves the (N, V) fp32 log-probs: the measurement can see them
    assert max(n for n, _ in ref) == full and sum(b for _, b in ref) >= full * 4
    # ours saves grad_h (N, d) + grad_W (V, d) = 1.125 MiB, < 1/4 of the 8 MiB logits
    assert max(n for n, _ in ours) < full
    assert sum(b for _, b in ours) == (N * D + V * D) * 4 < full * 4 // 4


def test_saved_tensor_meter(toy):
    """The perf stage's own meter (parameters excluded) on the LM head as a module."""
    from steps.perf.memory import SavedTensorMeter

    h, w, t = toy
    head = torch.nn.Linear(D, V, bias=False)
    head.weight.data.copy_(w)
    measured = {}
    for name, fn in {
        "ours": lambda x: linear_cross_entropy(x, head.weight, t, chunk_size=CHUNK),
        "ref": lambda x: reference_linear_cross_entropy(x, head.weight, t),
    }.items():
        meter = SavedTensorMeter(head)
        with meter():
            fn(h.clone().requires_grad_()).backward()
        measured[name] = meter.bytes
    assert measured["ref"] >= N * V * 4  # log-probs (+ h)
    assert measured["ours"] == (N * D + V * D) * 4  # grad_h + grad_W only


def test_largest_tensor_created(toy):
    """TorchDispatchMode sees every tensor any op creates, in forward and backward: ours never
    makes one larger than a chunk's logits, the reference makes the full (N, V)."""
    for fn, bound in (
        (lambda *a: linear_cross_entropy(*a, chunk_size=CHUNK), CHUNK * V),
        (reference_linear_cross_entropy, N * V),
    ):
        with OpLog() as log:
            loss_and_grads(fn, *toy)
        assert log.largest == bound


# ---- 4. the GPTConfig.fused_ce hook -------------------------------------------------------------
@pytest.mark.parametrize("tie", [True, False])
def test_gpt_fused_ce_hook(tie):
    from steps.models.gpt import GPTConfig, GPTLMHeadModel, shift_labels

    kw = dict(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=16, tie_weights=tie)
    torch.manual_seed(0)
    plain = GPTLMHeadModel(GPTConfig(**kw)).double().train()
    fused = GPTLMHeadModel(GPTConfig(**kw, fused_ce=True, ce_chunk=5)).double().train()
    fused.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :4] = -100

    out = fused(ids, labels=labels)
    assert out.logits is None
    out.loss.backward()
    # the unfused loss in fp64 (causal_lm_loss upcasts with .float(), i.e. rounds fp64 to fp32)
    logits = plain(ids).logits
    ref = F.cross_entropy(logits.view(-1, 61), shift_labels(labels).view(-1))
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=0, atol=1e-12)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-12, msg=name)
    # and the model's own loss agrees at its fp32 precision
    torch.testing.assert_close(out.loss, plain(ids, labels=labels).loss.double(), rtol=1e-6, atol=0)
    # eval mode and calls without labels are unchanged: logits come back
    fused.eval()
    ev = fused(ids, labels=labels)
    assert ev.logits is not None and ev.logits.shape == (2, 16, 61)
    assert torch.equal(ev.loss, plain.eval()(ids, labels=labels).loss)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_autocast_peak_memory():
    """CUDA, bf16 autocast: close to fp64, and the allocator's peak over forward + backward stays
    below one copy of the fp32 logits (128 MiB here) while the reference's exceeds it."""
    n, v, d, chunk = 4096, 8192, 64, 512
    h, w, t = (x.cuda() for x in make_inputs(n=n, v=v, d=d, dtype=torch.float32))
    exact = loss_and_grads(reference_linear_cross_entropy, h.double(), w.double(), t)
    peaks, errs = {}, {}
    for name, fn in (
        ("ours", lambda *a: linear_cross_entropy(*a, chunk_size=chunk)),
        ("ref", reference_linear_cross_entropy),
    ):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fn(hh, ww, t).backward()  # warm-up: cuBLAS workspace, allocator pools
        hh.grad = ww.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(hh, ww, t)
        loss.backward()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
        got = (loss.detach(), hh.grad, ww.grad)
        assert [a.dtype for a in got] == [torch.float32] * 3
        errs[name] = [rel_err(a, x) for a, x in zip(got, exact)]
    for ours, ref in zip(errs["ours"], errs["ref"]):
        assert ours < 5e-2 and ours < 2 * ref + 1e-3, errs
    assert peaks["ours"] < n * v * 4 <= peaks["ref"], peaks
