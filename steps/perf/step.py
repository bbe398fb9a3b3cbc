"""A perf cell's training step: gpt_train's one step (steps.models.train_step) with the cell's knobs.

Step knobs (perf config keys, StepOptions): amp none|bf16|fp16, tf32, compile (+ compile_mode),
adamw default|forloop|foreach|fused, grad_accum, accelerate, grad_clip, weight_decay, lr.
Model knobs: attn sdpa|manual, checkpoint_activations, fused_softmax, fused_layernorm (+
fused_backend); batch_size. A knob the device cannot run raises SkipCell before anything is
built, so a CPU run lists the CUDA-only cells with their reason.
"""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace

import torch

from steps.config import ConfigError
from steps.core import SkipCell
from steps.hardware import slow_matmul_reason
from steps.models.fp8 import convert_to_fp8
from steps.models.gpt import GPTLMHeadModel
from steps.models.train_step import StepOptions, TrainStep, matmul_dtype
from steps.perf.config import PerfConfig
from steps.perf.cuda_only import cuda_only_reason
from steps.perf.fused import fuse_model, triton_available


def check_device(p: PerfConfig, device: torch.device) -> None:
    """SkipCell for knobs that exist only on CUDA (never emulated on CPU): cuda_only.py, which reads
    the section as a dict without torch, for the rule too."""
    if device.type == "cuda":
        if p.fused_backend == "triton" and not triton_available():
            raise SkipCell("skipped: needs the triton package")
        cap = torch.cuda.get_device_capability(device)
        if p.model.fp8 and cap < (8, 9):
            raise SkipCell(
                f"skipped: fp8 matmuls need tensor cores of compute capability 8.9+ "
                f"(Ada, Hopper); this GPU is {cap[0]}.{cap[1]}"
            )
        return
    reason = cuda_only_reason(asdict(p))
    if reason:
        raise SkipCell(f"skipped: {reason}")


def check_native_amp(p: PerfConfig, device: torch.device) -> None:
    """SkipCell for an AMP cell whose dtype this CPU has no fast matmul for (no AVX512-BF16/AMX:
    bf16 matmuls run ~100x slower than fp32, an hours-long cell that says nothing about AMP).
    Decided by a small probe matmul (hardware.native_matmul); `skip_slow_amp: false` runs it."""
    if p.amp == "none" or not p.skip_slow_amp:
        return
    reason = slow_matmul_reason(peak_dtype(p), device.type)
    if reason:
        raise SkipCell(f"skipped: {reason}")


def peak_dtype(p: PerfConfig) -> str:
    """The matmul dtype that bounds this cell: the MFU denominator is measured in it (fp8 cells
    too are quoted against the autocast dtype's peak, as torchtitan quotes its fp8 runs: the
    attention, the head and the loss stay in bf16)."""
    return matmul_dtype(p.amp)


def padded_vocab(p: PerfConfig) -> int:
    """The embedding/LM-head rows: the vocabulary rounded up to pad_vocab_multiple (nanoGPT's
    50257 -> 50304: matmul tiles divide it). The data never uses the extra rows."""
    m = p.model.pad_vocab_multiple
    return -(-p.model.vocab_size // m) * m


def gpt_config(p: PerfConfig):
    """The model's config: perf.model's GPTConfig knobs, the padded vocabulary, and the model
    knobs perf keeps beside the step's."""
    return p.model.knobs(vocab_size=padded_vocab(p), attn=p.attn, checkpoint_activations=p.checkpoint_activations)


def synthetic_batches(p: PerfConfig, seed: int, device: torch.device) -> list[torch.Tensor]:
    """A fixed pool of random token batches (same for every cell with the same batch size):
    throughput does not depend on the text, and the loss after K steps is comparable."""
    gen = torch.Generator().manual_seed(seed)
    shape = (p.batch_size, p.model.block_size)
    return [torch.randint(0, p.model.vocab_size, shape, generator=gen).to(device) for _ in range(p.data_batches)]


def micro_batch(p: PerfConfig) -> int:
    if p.batch_size % p.grad_accum:
        raise ConfigError(f"perf.batch_size={p.batch_size} must be divisible by perf.grad_accum={p.grad_accum}")
    return p.batch_size // p.grad_accum


def build_step(p: PerfConfig, device: torch.device, probe=None) -> tuple[TrainStep, dict]:
    """The cell's model (model knobs: attention, checkpointing, fused kernels) in the one
    training step (step knobs). Returns (step, fused module counts).

    `probe(label, trainer)` (optional) is called at the seed's memory checkpoints while
    building: "before model", "after model", "after optimizer"."""
    micro_batch(p)
    opts = StepOptions.from_params(p)
    probe = probe or (lambda label, trainer: None)
    probe("before model", None)
    model = GPTLMHeadModel(gpt_config(p)).to(device)
    fused = fuse_model(model, p.fused_softmax, p.fused_layernorm, p.fused_backend)
    if p.model.fp8:
        fused["fp8_linear"] = convert_to_fp8(model)
    probe("after model", SimpleNamespace(model=model))
    ts = TrainStep(model, device, opts)
    probe("after optimizer", ts)
    return ts, fused


def micro_batches(x: torch.Tensor, p: dict) -> list[torch.Tensor]:
    """A step's batch as its grad_accum micro-batches."""
    return list(x.chunk(p.grad_accum))
