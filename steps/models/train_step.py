"""The one GPT training step: forward, backward over micro-batches, clip, update, zero — with
every performance knob as an option.

`gpt_train`'s loop, the perf matrix, the ours-vs-HF benchmark and the sharding stage's
single-device reference all run this step, so the perf matrix times exactly the step that
`gpt_train` trains with (AdamW with decay groups, gradient clipping, accumulation), and a knob
measured in the matrix is one option away in a training run.

    opts = StepOptions(lr=6e-4, amp="bf16", compile=True)
    ts = TrainStep(model, device, opts)           # builds AdamW (decay groups) unless given one
    ts.set_lr(lr_at(step, ...))
    loss, grad_norm = ts.step([x0, x1])           # grad_accum = len(micro-batches)

Options (the perf knobs that belong to the step, not to the model):
  amp            none | bf16 | fp16 autocast; fp16 adds a GradScaler (unscaled before clipping)
  tf32           TF32 tensor-core matmuls on CUDA
  compile        torch.compile the forward (compile_mode: default | reduce-overhead | max-autotune)
  optimizer      adamw | adafactor (torch.optim.Adafactor: factored second moments, no momentum)
  adamw          default | forloop | foreach | fused: torch.optim.AdamW's implementations
  grad_clip      max global gradient norm (0 = no clipping; the norm is still returned as NaN)
  accelerate     HF accelerate's Accelerator.prepare(model, optimizer) (mixed precision its own)
Model knobs (attention kind, activation checkpointing, fused kernels, vocabulary padding) are
the model's config: `steps.perf.step.build_step` applies them.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from typing import Callable, Literal, Sequence

import torch

from steps.config.typed import TRAJECTORY

Amp = Literal["none", "bf16", "fp16"]
# the precision knob (`amp` in every stage's config): the dtype the matmuls run in, autocast unless none
AMP_DTYPES = {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepOptions:
    """The step's knobs and their defaults: the only declaration (the stage schemas' entries for
    these keys must match it: tests/test_config_knobs.py). The stages' section dataclasses
    inherit these fields (steps/perf/config.py, steps/models/train_config.py)."""

    lr: float = field(default=3e-4, metadata=TRAJECTORY)
    weight_decay: float = field(default=0.1, metadata=TRAJECTORY)
    betas: tuple[float, float] = field(default=(0.9, 0.95), metadata=TRAJECTORY)
    grad_clip: float = field(default=1.0, metadata=TRAJECTORY)
    grad_accum: int = 1
    amp: Amp = "none"
    tf32: bool = False
    compile: bool = False
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    optimizer: Literal["adamw", "adafactor"] = "adamw"
    adamw: Literal["default", "forloop", "foreach", "fused"] = "fused"
    accelerate: bool = False

    @classmethod
    def from_params(cls, p, **override) -> "StepOptions":
        """The options a stage section holds, its dict or its dataclass (other keys ignored)."""
        section = p if isinstance(p, dict) else vars(p)
        kw = {f.name: section[f.name] for f in fields(cls) if f.name in section}
        if "betas" in kw:
            kw["betas"] = tuple(kw["betas"])
        return cls(**{**kw, **override})


def matmul_dtype(amp: str) -> str:
    """The dtype name an `amp` runs its matmuls in (float32, bfloat16, float16): the MFU peak's."""
    return str(AMP_DTYPES[amp]).removeprefix("torch.")


def amp_of(dtype: str) -> str:
    """The `amp` whose matmuls run in `dtype` (float32 -> none): the inverse of matmul_dtype."""
    return next(amp for amp in AMP_DTYPES if matmul_dtype(amp) == dtype)


def autocast(device: torch.device, amp: str):
    """torch.autocast in the option's dtype, or nothing for fp32."""
    return nullcontext() if amp == "none" else torch.autocast(device.type, dtype=AMP_DTYPES[amp])


def make_optimizer(model: torch.nn.Module, opts: StepOptions) -> torch.optim.Optimizer:
    """AdamW with nanoGPT's decay groups: matrices (Linear/Embedding weights) decay, biases and
    norm gains (1-D tensors) do not. `opts.adamw` picks the implementation: torch's default,
    the per-tensor loop, foreach (multi-tensor) or fused (one kernel; falls back to the default
    where a parameter's device or dtype has no fused kernel). `opts.optimizer: adafactor` builds
    torch.optim.Adafactor on the same groups instead (its own defaults for the decay rate and eps)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": opts.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if opts.optimizer == "adafactor":
        return torch.optim.Adafactor(groups, lr=opts.lr)
    impl = {"default": {}, "forloop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[
        opts.adamw
    ]
    if opts.adamw == "fused" and not all(
        p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params
    ):
        impl = {}
    return torch.optim.AdamW(groups, lr=opts.lr, betas=tuple(opts.betas), **impl)


def set_tf32(enabled: bool, device: torch.device) -> None:
    """TF32 tensor-core matmuls on CUDA (set before the MFU peak is measured and before training)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled


class TrainStep:
    """model + optimizer + options. `step(micro_batches)` -> (mean loss, grad norm tensor).

    `probe(label)` (optional, per call) is called inside the step at "after forward" (each
    micro-batch), "after backward", "after step" and "after zero_grad": the perf stage's memory
    timeline and the sharding reference's per-step gradients read the state there."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        opts: StepOptions,
        optimizer: torch.optim.Optimizer | None = None,
    ):
        self.opts, self.device, self.model = opts, device, model
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        set_tf32(opts.tf32, device)
        self.optimizer = optimizer if optimizer is not None else make_optimizer(model, opts)
        # fp16 gradients underflow without loss scaling; accelerate brings its own scaler
        self.scaler = torch.amp.GradScaler(device.type) if opts.amp == "fp16" and not opts.accelerate else None
        self.accelerator = None
        self.forward = model
        if opts.accelerate:
            from accelerate import Accelerator  # optional path: only its cells pay for the import

            self.accelerator = Accelerator(
                cpu=device.type == "cpu", mixed_precision="no" if opts.amp == "none" else opts.amp
            )
            self.forward, self.optimizer = self.accelerator.prepare(model, self.optimizer)
        if opts.compile:
            self.forward = torch.compile(self.forward, mode=opts.compile_mode)
        self.cuda_graphs = opts.compile and opts.compile_mode != "default" and device.type == "cuda"

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def autocast(self):
        if self.accelerator is not None:  # accelerate autocasts inside its prepared forward
            return nullcontext()
        return autocast(self.device, self.opts.amp)

    def backward(self, loss: torch.Tensor) -> None:
        if self.accelerator is not None:
            self.accelerator.backward(loss)
        elif self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def clip(self) -> torch.Tensor:
        """Global gradient norm (before clipping), clipped to opts.grad_clip when > 0."""
        if self.opts.grad_clip <= 0:
            return torch.full((), float("nan"))
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.accelerator is not None:
            return self.accelerator.clip_grad_norm_(params, self.opts.grad_clip)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        return torch.nn.utils.clip_grad_norm_(params, self.opts.grad_clip)

    def update(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the update if unscale_ found inf/nan
            self.scaler.update()
        else:
            self.optimizer.step()

    def step(
        self, micro_batches: Sequence[torch.Tensor], probe: Callable[[str], None] | None = None
    ) -> tuple[float, torch.Tensor]:
        """One optimizer step over the micro-batches (labels = inputs; the model shifts):
        returns (mean loss over micro-batches, grad norm)."""
        probe = probe or (lambda label: None)
        n = len(micro_batches)
        # CUDA graphs + accumulation: the graphs' outputs are overwritten by the next replay, so a
        # .grad first allocated by a replayed backward would be too (seen on an H200: tied wte's
        # "Gradient addition node"); stable zeroed buffers outside capture are PyTorch's own fix
        stable_grads = self.cuda_graphs and n > 1
        if stable_grads:
            for q in self.model.parameters():
                if q.requires_grad and q.grad is None:
                    q.grad = torch.zeros_like(q)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for x in micro_batches:
            x = x.to(self.device, non_blocking=True)
            if self.cuda_graphs:  # a new iteration: the graphs may overwrite the last one's outputs
                torch.compiler.cudagraph_mark_step_begin()
            with self.autocast():
                out = self.forward(x, labels=x)
            probe("after forward")
            loss = out.loss / n
            self.backward(loss)
            total += loss.detach().double()
            del out, loss
        probe("after backward")
        norm = self.clip()
        self.update()
        probe("after step")
        self.optimizer.zero_grad(set_to_none=not stable_grads)
        probe("after zero_grad")
        return total.item(), norm

    def timed_step(self, micro_batches: Sequence[torch.Tensor], probe=None) -> tuple[float, float]:
        """(seconds, loss) of one step, synchronised so the device work is inside the timer."""
        self.sync()
        t0 = time.perf_counter()
        loss, _ = self.step(micro_batches, probe)
        self.sync()
        return time.perf_counter() - t0, loss
