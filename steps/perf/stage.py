"""perf: one cell of the single-device performance matrix (a GPT training step with some knobs
changed from the baseline), timed, with its memory accounted for.

Per cell: tokens/s (median and p10/p90 of the timed steps after warm-up), MFU against the matmul
peak measured in this job for the cell's dtype, peak memory, loss after warm-up + timed steps
from the same seed, speedup and loss drift against the baseline cell (read from its
metrics.json: the rule makes every other cell depend on it). The timeline cell also records the
seed's memory timeline over its first two steps.
"""
from __future__ import annotations

import json
import math
from contextlib import ExitStack

import numpy as np
import pandas as pd

from steps.config import ConfigError
from steps.tracking import StageRun

MiB = 2**20
# Keys whose change alters the data or the optimisation path: the loss is then not comparable.
SAME_TRAJECTORY = ("model", "batch_size", "data_batches", "warmup_steps", "timed_steps", "lr",
                   "weight_decay", "grad_clip")
NOT_A_CHANGE = ("desc",)
SAVED_ROW = "saved activations (+autocast weight copies)"


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def describe_change(params: dict, base: dict) -> str:
    """`k=v` for every resolved key that differs from the baseline cell's resolved config."""
    a, b = flat(params), flat(base)
    return ", ".join(f"{k}={a.get(k)}" for k in sorted(set(a) | set(b))
                     if a.get(k) != b.get(k) and k.split(".")[0] not in NOT_A_CHANGE)


def load_baseline(ctx: StageRun) -> dict | None:
    """The baseline cell's metrics.json, the rule's `baseline` input (None for the baseline itself
    or a lone manual run)."""
    path = ctx.inputs.get("baseline")
    if ctx.cell == ctx.params["baseline_cell"] or not path:
        return None
    rec = json.loads(open(path).read())
    return rec if rec.get("status") == "ok" else None


def describe_cell(ctx: StageRun) -> dict | None:
    """Desc and Change columns (set before any skip); returns the baseline record if available."""
    base = load_baseline(ctx)
    ctx.info |= {"desc": ctx.params["desc"], "params": ctx.params}
    if ctx.cell == ctx.params["baseline_cell"]:
        ctx.info["change"] = ""
    else:
        ctx.info["change"] = (describe_change(ctx.params, base["info"]["params"]) if base
                              else "(baseline not available)")
    return base


def compare_to_baseline(ctx: StageRun, base: dict | None, metrics: dict) -> None:
    """speedup and loss drift vs the baseline cell (drift only when the trajectory is the same)."""
    if ctx.cell == ctx.params["baseline_cell"]:
        metrics |= {"speedup": 1.0, "loss_drift": 0.0}
        return
    if base is None:
        return
    bp = base["info"]["params"]
    metrics["speedup"] = metrics["tokens_per_s"] / base["metrics"]["tokens_per_s"]
    if all(flat({k: ctx.params[k]}) == flat({k: bp[k]}) for k in SAME_TRAJECTORY):
        metrics["loss_drift"] = metrics["loss"] - base["metrics"]["loss"]
    else:
        ctx.info["drift_note"] = "different batches or schedule: loss not comparable"


class Timeline:
    """The seed's memory checkpoints for the first steps of the timeline cell."""

    def __init__(self, device, analytic: dict):
        from steps.perf.memory import MemoryProbe

        warm_lazy_imports(device)  # else RSS jumps at the first optimizer/backward: code, not data
        self.probe, self.analytic = MemoryProbe(device), analytic
        self.meter, self.iteration, self.hooks = None, -1, []

    def __call__(self, label: str, ts=None) -> None:
        from steps.perf.memory import timeline_analytic

        model, opt = getattr(ts, "model", None), getattr(ts, "optimizer", None)
        saved = self.meter.bytes if self.meter and label.startswith(("inside", "after forward")) else 0
        if label == "after backward" and self.meter:
            self.meter.reset()  # backward frees what forward saved
        expected = 0.0 if model is None else timeline_analytic(self.analytic, label, bool(opt and opt.state))
        self.probe(label, self.iteration, model, opt, saved, expected)

    def attach(self, ts) -> None:
        """Forward hooks on the blocks: "inside forward i" after block i (eager models only)."""
        from steps.perf.memory import SavedTensorMeter

        self.meter = SavedTensorMeter(ts.model)
        self.hooks = [block.register_forward_hook(lambda m, a, o, i=i: self(f"inside forward {i + 1}", ts))
                      for i, block in enumerate(ts.model.transformer.h)]

    def step(self, ts, x) -> tuple[float, float]:
        """One instrumented step; hooks come off after `iterations` steps."""
        self.iteration += 1
        with self.meter():
            out = ts.timed_step(x, probe=lambda label: self(label, ts))
        if self.iteration + 1 == self.iterations:
            for h in self.hooks:
                h.remove()
        return out

    iterations = 2

    @property
    def active(self) -> bool:
        return self.iteration + 1 < self.iterations

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.probe.rows)


def warm_lazy_imports(device) -> None:
    """One tiny AdamW step: torch loads optimizer/autograd code lazily, which RSS would count."""
    import torch

    w = torch.zeros(4, device=device, requires_grad=True)
    opt = torch.optim.AdamW([w])
    (w * 2).sum().backward()
    opt.step()


def memory_table(ts, micro_batch: int, analytic: dict, peak_bytes: float, compiled: bool) -> pd.DataFrame:
    """Analytic vs measured: state (summed tensor bytes), saved activations, process peak."""
    from steps.perf.memory import SavedTensorMeter, state_bytes

    x = ts_batch(ts, micro_batch)
    meter = SavedTensorMeter(ts.model)
    with meter(), ts.autocast():
        loss = ts.forward(x, labels=x).loss
    ts.backward(loss)
    measured = state_bytes(ts.model, ts.optimizer)
    ts.optimizer.zero_grad(set_to_none=True)  # no update: the cell's loss trajectory is untouched
    saved = math.nan if compiled else meter.bytes
    rows = [(k, analytic[k], measured[k]) for k in ("params", "grads", "optimizer", "state")]
    rows.append((SAVED_ROW,
                 analytic["activations"] + analytic["autocast_weights"], saved))
    rows.append(("logits + cross-entropy gradients", analytic["logits"] + analytic["loss_backward"], math.nan))
    rows.append(("peak of a step", analytic["peak"], peak_bytes))
    df = pd.DataFrame(rows, columns=["component", "analytic", "measured"])
    return pd.DataFrame({"component": df.component, "analytic_mib": df.analytic / MiB,
                         "measured_mib": df.measured / MiB,
                         "err_pct": 100 * (df.measured - df.analytic) / df.analytic})


def ts_batch(ts, batch: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    cfg = ts.model.config
    return torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), generator=gen).to(ts.device)


class PeakMemory:
    """Peak memory of the last warm-up step, a full steady-state step (the timed steps follow
    with the CPU allocator in reuse mode, where RSS no longer follows tensor bytes: see
    hardware.reuse_freed_memory). CUDA: allocator peaks. CPU: VmHWM growth over the RSS at the
    start of that step, plus the tensors alive then (params + optimizer state, counted exactly):
    code and caches loaded earlier (oneDNN kernels JIT-compiled for bf16/AMX, inductor
    artifacts, lazily imported modules) are RSS but not training memory."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.rss_reset = self.alive = 0

    def reset(self, ts) -> None:
        import torch

        from steps import hardware
        from steps.perf.memory import state_bytes

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        self.alive = state_bytes(ts.model, ts.optimizer)["state"]
        self.rss_reset = hardware.rss_bytes()
        hardware.reset_peak_rss()

    def read(self) -> dict:
        import torch

        from steps import hardware

        if self.cuda:
            return {"peak_mem_mib": torch.cuda.max_memory_allocated() / MiB,
                    "peak_reserved_mib": torch.cuda.max_memory_reserved() / MiB}
        return {"peak_mem_mib": (hardware.peak_rss_bytes() - self.rss_reset + self.alive) / MiB}


def check_timeline(p: dict) -> None:
    if p["compile"]:
        raise ConfigError("perf.timeline_cell must be an eager cell (hooks do not fire in compiled code)")
    if p["warmup_steps"] <= Timeline.iterations:
        raise ConfigError(f"perf.warmup_steps must exceed the {Timeline.iterations} instrumented "
                          "timeline steps: the timed steps must follow a plain warm-up step")


def train(ctx: StageRun, ts, timeline: Timeline | None) -> tuple[list, list, dict]:
    """warm-up + timed steps on the fixed batch pool: step times, losses, peak memory (of the
    last warm-up step; the timed steps run with the CPU allocator reusing freed blocks)."""
    from steps import hardware
    from steps.perf.step import micro_batches, synthetic_batches

    p = ctx.params
    batches = [micro_batches(x, p) for x in synthetic_batches(p, ctx.seed, ts.device)]
    n_warm, n = p["warmup_steps"], p["warmup_steps"] + p["timed_steps"]
    peak_mem, mem = PeakMemory(ts.device), {}
    times, losses = [], []
    with ExitStack() as timed_mode:
        for i in ctx.progress(range(n), total=n, desc=f"perf:{ctx.cell}"):
            x = batches[i % len(batches)]
            if i == n_warm - 1:
                peak_mem.reset(ts)
            if i == n_warm:
                mem = peak_mem.read()
                if ts.device.type == "cpu":
                    timed_mode.enter_context(hardware.reuse_freed_memory())
            if timeline and timeline.active:   # the first (warm-up) steps, instrumented
                dt, loss = timeline.step(ts, x)
            else:
                dt, loss = ts.timed_step(x)
            times.append(dt)
            losses.append(loss)
            ctx.log_metrics({"train_loss": loss, "step_time_ms": dt * 1e3}, step=i)
    return times, losses, mem


def throughput(ts, tokens_per_step: int, timed: np.ndarray, peaks: dict) -> dict:
    """tokens/s median and p10/p90 over the timed steps, and MFU in model FLOPs (6N + 12·L·d·T,
    recomputation by checkpointing not counted) against the measured and the published peak
    (`peaks` as hardware.peak_flops returns it)."""
    from steps import hardware

    cfg = ts.model.config
    tps = tokens_per_step / timed
    fpt = hardware.gpt_flops_per_token(ts.model.num_params(non_embedding=True), cfg.n_layer,
                                       cfg.n_embd, cfg.block_size)
    med = float(np.median(tps))
    return {"tokens_per_s": med, "tokens_per_s_p10": float(np.percentile(tps, 10)),
            "tokens_per_s_p90": float(np.percentile(tps, 90)),
            "step_time_ms": float(np.median(timed)) * 1e3, "peak_flops": peaks["measured"],
            "published_peak_flops": peaks.get("published") or math.nan,
            "flops_per_token": fpt, "achieved_flops": fpt * med, **hardware.mfu(fpt * med, peaks)}


def run(ctx: StageRun) -> dict:
    import torch

    from steps import hardware
    from steps.perf import memory
    from steps.models.train_step import set_tf32
    from steps.perf.step import build_step, check_device, check_native_amp, gpt_config, micro_batch, peak_dtype

    p = ctx.params
    base = describe_cell(ctx)
    device = ctx.device
    ctx.info |= {"device": device.type, "peak_dtype": peak_dtype(p)}
    check_device(p, device)
    check_native_amp(p, device)
    is_timeline = ctx.cell == p["timeline_cell"]
    if is_timeline:
        check_timeline(p)
    set_tf32(p["tf32"], device)  # the peak must be measured in the mode the cell runs in
    peaks = hardware.peak_flops(peak_dtype(p), device, n=p["peak_matmul_size"])
    ctx.info["published_peak"] = peaks["published_name"]
    micro = micro_batch(p)
    analytic = memory.analytic_memory(gpt_config(p), micro, p["amp"], p["checkpoint_activations"],
                                      p["attn"], grad_accum=p["grad_accum"])

    timeline = Timeline(device, analytic) if is_timeline else None
    torch.manual_seed(ctx.seed)
    ts, fused = build_step(p, device, probe=timeline)
    if timeline:
        timeline.attach(ts)
    times, losses, mem_peak = train(ctx, ts, timeline)
    tokens_per_step = p["batch_size"] * p["model"]["block_size"]
    metrics = throughput(ts, tokens_per_step, np.array(times[p["warmup_steps"]:]), peaks)
    metrics |= {"first_step_s": times[0], "loss": losses[-1], **mem_peak}
    compare_to_baseline(ctx, base, metrics)
    ctx.info["fused_modules"] = fused

    mt = memory_table(ts, micro, analytic, mem_peak["peak_mem_mib"] * MiB, p["compile"])
    ctx.log_table(mt, "memory")
    rows = mt.set_index("component")
    for key, row in (("state", "state"), ("saved", SAVED_ROW)):
        metrics |= {f"mem_{key}_analytic_mib": rows.analytic_mib[row],
                    f"mem_{key}_measured_mib": rows.measured_mib[row], f"mem_{key}_err_pct": rows.err_pct[row]}
    metrics["mem_peak_analytic_mib"] = analytic["peak"] / MiB
    metrics["mem_peak_err_pct"] = rows.err_pct["peak of a step"]
    if timeline:
        df = timeline.table()
        ctx.log_table(df, "memory_timeline")
        ctx.log_figure(memory.plot_timeline(df.to_dict("records")), "memory_timeline")
    return metrics
