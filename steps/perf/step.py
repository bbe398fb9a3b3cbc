"""One GPT training step with every perf knob of the matrix (nanoGPT's train loop, factored).

Knobs (perf config keys): amp none|bf16|fp16, tf32, compile, attn sdpa|manual, adamw
default|foreach|fused, checkpoint_activations, grad_accum, accelerate, fused_softmax,
fused_layernorm (+ fused_backend), batch_size. A knob the device cannot run raises SkipCell
before anything is built, so a CPU run lists the CUDA-only cells with their reason.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from steps.config import ConfigError
from steps.tracking import SkipCell

MODEL_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias", "pos", "norm",
              "activation")


def check_device(p: dict, device: torch.device) -> None:
    """SkipCell for knobs that exist only on CUDA (never emulated on CPU)."""
    from steps.perf.fused import triton_available

    if device.type == "cuda":
        if p["fused_backend"] == "triton" and not triton_available():
            raise SkipCell("skipped: needs the triton package")
        return
    if p["tf32"]:
        raise SkipCell("skipped: needs CUDA (TF32 is an NVIDIA tensor-core matmul mode)")
    if p["amp"] == "fp16":
        raise SkipCell("skipped: needs CUDA (fp16 autocast with GradScaler)")
    if p["fused_backend"] == "triton":
        raise SkipCell("skipped: needs CUDA (Triton kernels)")


def check_native_amp(p: dict, device: torch.device) -> None:
    """SkipCell for an AMP cell whose dtype this CPU has no fast matmul for (no AVX512-BF16/AMX:
    bf16 matmuls run ~100x slower than fp32, an hours-long cell that says nothing about AMP).
    Decided by a small probe matmul (hardware.native_matmul); `skip_slow_amp: false` runs it."""
    from steps.hardware import slow_matmul_reason

    if p["amp"] == "none" or not p["skip_slow_amp"]:
        return
    reason = slow_matmul_reason(peak_dtype(p), device.type)
    if reason:
        raise SkipCell(f"skipped: {reason}")


def peak_dtype(p: dict) -> str:
    """The matmul dtype that bounds this cell: the MFU denominator is measured in it."""
    return {"bf16": "bfloat16", "fp16": "float16"}.get(p["amp"], "float32")


def gpt_config(p: dict):
    from steps.models.gpt import GPTConfig

    return GPTConfig(**{k: p["model"][k] for k in MODEL_KEYS}, attn=p["attn"],
                     checkpoint_activations=p["checkpoint_activations"])


def make_optimizer(model: torch.nn.Module, p: dict) -> torch.optim.Optimizer:
    """AdamW in torch's three implementations: per-tensor loop, foreach (multi-tensor), fused."""
    impl = {"default": {}, "forloop": {"foreach": False}, "foreach": {"foreach": True},
            "fused": {"fused": True}}[p["adamw"]]
    return torch.optim.AdamW(model.parameters(), lr=p["lr"], weight_decay=p["weight_decay"],
                             betas=(0.9, 0.95), **impl)


def synthetic_batches(p: dict, seed: int, device: torch.device) -> list[torch.Tensor]:
    """A fixed pool of random token batches (same for every cell with the same batch size):
    throughput does not depend on the text, and the loss after K steps is comparable."""
    gen = torch.Generator().manual_seed(seed)
    shape = (p["batch_size"], p["model"]["block_size"])
    return [torch.randint(0, p["model"]["vocab_size"], shape, generator=gen).to(device)
            for _ in range(p["data_batches"])]


def set_tf32(p: dict, device: torch.device) -> None:
    """TF32 tensor-core matmuls on CUDA (before the peak is measured and before training)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = p["tf32"]


def micro_batch(p: dict) -> int:
    if p["batch_size"] % p["grad_accum"]:
        raise ConfigError(f"perf.batch_size={p['batch_size']} must be divisible by "
                          f"perf.grad_accum={p['grad_accum']}")
    return p["batch_size"] // p["grad_accum"]


class TrainStep:
    """model + optimizer + the knobs; `step(x)` runs forward/backward/update and returns the loss.

    `probe(label, trainer)` (optional) is called at the seed's memory checkpoints while building;
    `step(x, probe)` calls `probe(label)` inside the step."""

    def __init__(self, p: dict, device: torch.device, probe=None):
        from steps.perf.fused import fuse_model
        from steps.models.gpt import GPTLMHeadModel

        self.p, self.device = p, device
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        micro_batch(p)
        set_tf32(p, device)
        probe = probe or (lambda label, trainer: None)
        probe("before model", self)
        self.config = gpt_config(p)
        self.model = GPTLMHeadModel(self.config).to(device)
        self.fused = fuse_model(self.model, p["fused_softmax"], p["fused_layernorm"], p["fused_backend"])
        probe("after model", self)
        self.optimizer = make_optimizer(self.model, p)
        probe("after optimizer", self)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(p["amp"])
        # fp16 gradients underflow without loss scaling; accelerate brings its own scaler
        self.scaler = (torch.amp.GradScaler(device.type) if p["amp"] == "fp16" and not p["accelerate"]
                       else None)
        self.accelerator = None
        self.forward = self.model
        if p["accelerate"]:
            from accelerate import Accelerator

            self.accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision=p["amp"]
                                           if p["amp"] != "none" else "no")
            self.forward, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        if p["compile"]:
            self.forward = torch.compile(self.forward, mode=p["compile_mode"])

    @property
    def tokens_per_step(self) -> int:
        return self.p["batch_size"] * self.p["model"]["block_size"]

    def autocast(self):
        if self.amp_dtype is None or self.accelerator is not None:  # accelerate autocasts itself
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def backward(self, loss):
        if self.accelerator is not None:
            self.accelerator.backward(loss)
        elif self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def update(self):
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def step(self, x: torch.Tensor, probe=None) -> float:
        """One optimizer step over `grad_accum` micro-batches of x; the mean loss."""
        probe = probe or (lambda label: None)
        total = 0.0
        for micro in x.chunk(self.p["grad_accum"]):
            with self.autocast():
                out = self.forward(micro, labels=micro)
            probe("after forward")
            loss = out.loss / self.p["grad_accum"]
            self.backward(loss)
            total += loss.item()
            del out, loss
        probe("after backward")
        self.update()
        probe("after step")
        self.optimizer.zero_grad(set_to_none=True)
        probe("after zero_grad")
        return total

    def timed_step(self, x: torch.Tensor, probe=None) -> tuple[float, float]:
        """(seconds, loss) of one step, synchronised so the device work is inside the timer."""
        self.sync()
        t0 = time.perf_counter()
        loss = self.step(x, probe)
        self.sync()
        return time.perf_counter() - t0, loss
