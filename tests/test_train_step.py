"""The one training step (steps/models/train_step.py) reproduces, bit for bit, the loss
trajectories of the four loops it replaced: gpt_train's, the perf matrix's, the ours-vs-HF
benchmark's and the sharding reference's. Each old loop is written out here as it was."""

from __future__ import annotations

import math

import pytest
import torch

from steps.models.gpt import GPTConfig, GPTLMHeadModel
from steps.models.train_step import StepOptions, TrainStep, amp_of, make_optimizer, matmul_dtype
from tests.conftest import TOY, perf_params

torch.set_num_threads(1)
CFG = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
STEPS = 10


def batches(accum: int = 1):
    g = torch.Generator().manual_seed(7)
    return [
        [torch.randint(0, CFG["vocab_size"], (4, CFG["block_size"]), generator=g) for _ in range(accum)]
        for _ in range(STEPS)
    ]


def model(seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    return GPTLMHeadModel(GPTConfig(**CFG)).to(dtype)


def run_new(m, opts, data, optimizer=None):
    ts = TrainStep(m, torch.device("cpu"), opts, optimizer)
    return [ts.step(b)[0] for b in data]


def old_loop(m, data, opt, clip: float | None):
    """The body both old loops shared: mean loss over micro-batches (summed as Python floats),
    backward each, [clip], step, zero."""
    losses = []
    for micro in data:
        total = 0.0
        for x in micro:
            loss = m(x, labels=x).loss / len(micro)
            loss.backward()
            total += loss.item()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


def old_gpt_train_loop(m, data, lr, wd, clip):
    """steps/models/training.py train_step + make_optimizer before the merge."""
    params = list(m.parameters())
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
        fused=True,
    )
    return old_loop(m, data, opt, clip)


def old_perf_loop(m, data, lr, wd, impl, betas=(0.9, 0.95)):
    """steps/perf/step.py TrainStep before the merge: decay on every parameter, no clipping."""
    return old_loop(m, data, torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd, betas=betas, **impl), None)


def assert_same(a_losses, b_losses, a_model, b_model):
    assert a_losses == b_losses  # bit for bit
    for (name, a), (_, b) in zip(a_model.named_parameters(), b_model.named_parameters()):
        assert torch.equal(a, b), name


def test_reproduces_gpt_train_loop_with_accumulation_and_clipping():
    data = batches(accum=2)
    ref, new = model(), model()
    old = old_gpt_train_loop(ref, data, lr=3e-3, wd=0.1, clip=0.5)
    assert_same(old, run_new(new, StepOptions(lr=3e-3, weight_decay=0.1, grad_clip=0.5, grad_accum=2), data), ref, new)
    assert old[-1] < old[0]  # it trains: the comparison is not between two untouched models


@pytest.mark.parametrize("impl,name", [({}, "default"), ({"foreach": True}, "foreach"), ({"fused": True}, "fused")])
def test_reproduces_old_perf_loop_given_its_optimizer(impl, name):
    """The old perf step differed only in its optimizer (decay on every tensor) and in never
    clipping: given that optimizer and no clipping, the one step runs the same trajectory."""
    data = batches(accum=2)
    ref, new = model(), model()
    old = old_perf_loop(ref, data, 3e-3, 0.1, impl)
    opt = torch.optim.AdamW(new.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95), **impl)
    assert_same(old, run_new(new, StepOptions(grad_clip=0.0, grad_accum=2, adamw=name), data, opt), ref, new)


def test_perf_cell_runs_the_gpt_train_step():
    """The perf matrix now times gpt_train's step: a perf cell's step = the old gpt_train loop
    at the cell's lr / weight decay / clipping (decay groups, clipping), and != the old perf loop."""
    from steps.perf.step import build_step, micro_batches

    p = perf_params(grad_accum=2, adamw="fused")
    torch.manual_seed(3)
    ts, _ = build_step(p, torch.device("cpu"))
    torch.manual_seed(3)
    ref = GPTLMHeadModel(ts.model.config)
    old_perf = GPTLMHeadModel(ts.model.config)
    old_perf.load_state_dict(ref.state_dict())
    g = torch.Generator().manual_seed(1)
    data = [
        micro_batches(torch.randint(0, TOY["vocab_size"], (4, TOY["block_size"]), generator=g), p) for _ in range(4)
    ]
    new = [ts.step(b)[0] for b in data]
    old = old_gpt_train_loop(ref, data, p.lr, p.weight_decay, p.grad_clip)
    assert_same(old, new, ref, ts.model)
    assert old_perf_loop(old_perf, data, p.lr, p.weight_decay, {"fused": True}) != new


def test_reproduces_benchmark_loop_given_its_optimizer():
    """training.benchmark before the merge: AdamW(lr 1e-4, fused), no groups, no clipping."""
    data = batches()
    ref, new = model(), model()
    old = old_perf_loop(ref, data, 1e-4, 0.01, {"fused": True}, betas=(0.9, 0.999))  # torch's defaults
    opt = torch.optim.AdamW(new.parameters(), lr=1e-4, fused=True)
    assert_same(old, run_new(new, StepOptions(grad_clip=0.0), data, opt), ref, new)


def test_reproduces_sharding_reference_loop():
    """the sharding stage's old native.py reference() loop (now steps/sharding/reference.py gpt_reference):
    zero_grad, forward, backward, record gradients, step; in float64 with the plan's optimizer."""
    from steps.sharding.gpt_init import full_model, gpt_batch
    from steps.sharding.plan import Plan
    from steps.sharding.reference import gpt_reference

    plan = Plan.from_params(
        {
            "backend": "torch_native",
            "model": "gpt",
            "strategy": "dp",
            "mesh": {"dp": 2},
            "optimizer": "sgd",
            "steps": 4,
            "batch_size": 4,
            "dtype": "float64",
            "gpt": {"vocab_size": 32, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16},
        }
    )
    m = full_model(plan, torch.float64)
    opt = plan.optimizer_for(m.parameters())
    losses, grads = [], []
    for step in range(plan.steps):
        ids = gpt_batch(plan, step)
        opt.zero_grad(set_to_none=True)
        loss = m(ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads.append({k: p.grad.detach().clone() for k, p in m.named_parameters()})
        opt.step()
    new_losses, new_grads, new_params = gpt_reference(plan, torch.float64)
    assert new_losses == losses
    for g_old, g_new in zip(grads, new_grads):
        assert all(torch.equal(g_old[k], g_new[k]) for k in g_old)
    assert all(torch.equal(p, new_params[k]) for k, p in m.named_parameters())


def test_decay_groups_and_clipping_norm():
    m = model()
    decay, no_decay = make_optimizer(m, StepOptions(weight_decay=0.3)).param_groups
    assert decay["weight_decay"] == 0.3 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(p) for p in m.parameters() if p.dim() >= 2}
    ts = TrainStep(m, torch.device("cpu"), StepOptions(grad_clip=1e-3))
    x = batches()[0][0]
    seen = {}
    ts.step(
        [x],
        probe=lambda label: seen.setdefault(
            label, [g.clone() for g in (p.grad for p in m.parameters()) if g is not None]
        ),
    )
    raw = math.sqrt(sum(float(g.pow(2).sum()) for g in seen["after backward"]))
    _, norm = TrainStep(model(), torch.device("cpu"), StepOptions(grad_clip=1e-3)).step([x])
    assert float(norm) == pytest.approx(raw, rel=1e-5) and raw > 1e-3  # the pre-clip norm, and clipping bit


def test_options_from_stage_sections():
    o = StepOptions.from_params({"amp": "bf16", "lr": 1e-3, "betas": [0.8, 0.9], "unrelated": 1})
    assert o.amp == "bf16" and o.lr == 1e-3 and o.betas == (0.8, 0.9)
    assert [matmul_dtype(a) for a in ("none", "bf16", "fp16")] == ["float32", "bfloat16", "float16"]
    assert amp_of("bfloat16") == "bf16" and amp_of("float32") == "none"
    assert StepOptions.from_params({"amp": "fp16", "compile": True}).compile


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-4)])
def test_ten_adamw_steps_ours_vs_hf_gpt2(dtype, tol):
    """llm.c's test_gpt2, last part: our GPT and HF GPT2LMHeadModel from the same weights, 10
    steps of the one training step (AdamW with decay groups, clipping) on the same batches:
    every step's loss and the final parameters agree (fp64 to 1e-10; fp32 to float rounding)."""
    from steps.models.hf_convert import hf_to_ours_state_dict, to_hf
    from steps.models.parity import float64_loss

    ours = model(seed=5, dtype=dtype)
    hf = to_hf(ours).to(dtype)
    if dtype == torch.float64:
        float64_loss(hf)  # HF's own loss casts fp64 logits to fp32
    init = {k: v.clone() for k, v in ours.state_dict().items()}
    opts = StepOptions(lr=3e-3, weight_decay=0.1, grad_clip=1.0)
    data = batches()[:2] * 5  # two batches, revisited: something to learn
    a = run_new(ours, opts, data)
    b = run_new(hf, opts, data)
    assert a[-1] < a[0] and all(not torch.equal(init[k], p) for k, p in ours.state_dict().items())  # they train
    assert max(abs(x - y) for x, y in zip(a, b)) <= tol, list(zip(a, b))
    theirs = hf_to_ours_state_dict(hf.state_dict())
    worst = max(float((p - theirs[k]).abs().max()) for k, p in ours.state_dict().items())
    assert worst <= tol, worst


def test_stable_grad_buffers_for_cuda_graphs_change_nothing_but_where_grads_live():
    """CUDA graphs + accumulation keep zeroed .grad buffers allocated outside capture (the H200's
    'tensor output of CUDAGraphs overwritten' at tied wte): the same losses and parameters as the
    usual set-to-None path, and the buffers stay between steps (forced on here: no GPU)."""
    data = batches(accum=2)
    ref, new = model(), model()
    opts = StepOptions(lr=3e-3, weight_decay=0.1, grad_clip=0.5, grad_accum=2)
    want = run_new(ref, opts, data)
    ts = TrainStep(new, torch.device("cpu"), opts)
    ts.cuda_graphs = True
    got = [ts.step(b)[0] for b in data]
    assert_same(want, got, ref, new)
    assert all(p.grad is not None and not p.grad.any() for p in new.parameters())  # kept, zeroed
