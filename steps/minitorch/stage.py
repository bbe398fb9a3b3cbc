"""minitorch: the from-scratch engine proven against torch and timed beside it, one cell per
model × backend (`kind` × `backend` in the config):

    ops         every op forward and backward vs torch autograd (fp64), the matmul kernel's GFLOP/s
                against this machine's measured fp64 GEMM peak
    gpt         assignment 2's GPT-2 loaded from our torch GPT's weights: logits, loss and every
                gradient by name (fp64), then the same AdamW steps on the plays' tokens from the same
                init (the loss trajectories compared), then tokens/s against torch eager on the same
                step, interleaved (steps/paired.py); `fast` is also timed against `reference`
    classifier  assignment 1's feed-forward network: a passage of a play -> its play's genre, accuracy
                against the majority class
    translate   assignment 2's translation pipeline (steps/minitorch/translate.py)

The engine computes in float64: torch eager is timed in float64 too, the same arithmetic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from steps.core import SkipCell, Stage, StageRun
from steps.minitorch import backends
from steps.presentation.minitorch import SHOWN

if TYPE_CHECKING:  # the config imports GPTConfig (torch): run imports it
    from steps.minitorch.config import MinitorchConfig, MinitorchGpt


def _backend(name: str) -> str:
    if name not in backends.available():
        raise SkipCell(f"backend {name!r} cannot run on this machine: {backends.why_unavailable(name)}")
    return name


def use_numba_threads(ctx: StageRun) -> int:
    """The fast backend's prange kernels run on the job's threads (its reserved cores, as torch's do:
    StageRun.use_threads), at most the NUMBA_NUM_THREADS Numba started with."""
    import numba

    limit = numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(min(ctx.threads, limit) if ctx.threads > 0 else limit)
    ctx.info["numba_threads"] = numba.get_num_threads()
    return ctx.info["numba_threads"]


# ---- ops ---------------------------------------------------------------------------------------
def matmul_vs_torch(backend: str, n: int, pairs: int) -> tuple:
    """The backend's n×n×n matmul kernel against torch's (fp64, same threads), interleaved: the
    speed ratio (with its interval) and each one's GFLOP/s from its median time."""
    import torch

    from steps.minitorch.tensor_data import TensorData
    from steps.paired import interleave, ratio_of_pairs

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((1, n, n)) for _ in range(2))
    ta, tb = torch.from_numpy(a[0]), torch.from_numpy(b[0])
    a, b, out = TensorData.from_numpy(a), TensorData.from_numpy(b), TensorData.from_numpy(np.zeros((1, n, n)))
    kernel = backends.kernels(backend).matmul
    ours, theirs = interleave(lambda: kernel(*out.tuple(), *a.tuple(), *b.tuple()), lambda: ta @ tb, pairs, warmup=1)
    flops = 2 * n**3
    return ratio_of_pairs(ours, theirs), flops / np.median(ours) / 1e9, flops / np.median(theirs) / 1e9


def run_ops(ctx: StageRun, p: MinitorchConfig, backend: str) -> dict:
    import pandas as pd
    import torch

    from steps.hardware import matmul_peak_flops
    from steps.minitorch.parity import op_parity

    torch.set_num_threads(max(ctx.threads, 1))
    errors = op_parity(backend, ctx.seed)
    ctx.log_table(pd.DataFrame({"op": list(errors), "max_abs_err": list(errors.values())}), "op_parity")
    worst = max(errors.values())
    if worst > p.op_tol:
        bad = {k: v for k, v in errors.items() if v > p.op_tol}
        raise RuntimeError(f"ops beyond {p.op_tol:g} on {backend}: {bad}")
    vs_torch, gflops, torch_gflops = matmul_vs_torch(backend, p.matmul_size, p.matmul_pairs)
    ctx.set_tag("matmul_vs_torch", str(vs_torch))
    peak = matmul_peak_flops("float64", "cpu", n=p.peak_matmul_size) / 1e9
    return {
        "op_parity_err_max": worst,
        "ops_checked": len(errors),
        "matmul_gflops": gflops,
        "torch_matmul_gflops": torch_gflops,
        "gemm_peak_gflops": peak,
        "matmul_of_peak": gflops / peak,
        **vs_torch.as_metrics("matmul_vs_torch"),
    }


# ---- gpt ---------------------------------------------------------------------------------------
def load_tokens(ctx: StageRun, g: MinitorchGpt):
    from steps.gpt_train import load_data

    knobs = ("minitorch.gpt.block_size", "minitorch.gpt.max_tokens")
    return load_data(g.block_size, g.max_tokens, ctx.seed, ctx.inputs["corpus"], ctx.inputs["tokenizer"], knobs)


def torch_gpt(ctx: StageRun, g: MinitorchGpt, vocab_size: int):
    import torch

    from steps.models.gpt import GPTLMHeadModel

    torch.manual_seed(ctx.seed)
    return GPTLMHeadModel(g.knobs(vocab_size=vocab_size, dropout=0.0)).double()


def gpt_parity(torch_model, ours, idx) -> dict:
    """Logits, loss and every gradient by name (HF's shifted-label loss on both)."""
    import torch

    from steps.minitorch.models import _is_linear_weight, shifted_targets, torch_name

    torch_model.zero_grad()
    out = torch_model(torch.from_numpy(idx), labels=torch.from_numpy(idx))
    out.loss.backward()
    loss = ours.loss(idx, shifted_targets(idx))
    loss.backward()
    theirs = dict(torch_model.named_parameters())
    grad_err = 0.0
    for name, p in ours.named_parameters():
        g = p.value.grad.to_numpy()
        grad_err = max(
            grad_err,
            float(np.abs((g.T if _is_linear_weight(name) else g) - theirs[torch_name(name)].grad.numpy()).max()),
        )
    logits_err = float(np.abs(ours.forward(idx).to_numpy() - out.logits.detach().numpy()).max())
    return {"gpt_logits_err": logits_err, "gpt_loss_err": abs(loss.item() - out.loss.item()), "gpt_grad_err": grad_err}


class Trainers:
    """The same AdamW step on our engine and on torch, from the same weights."""

    def __init__(self, torch_model, ours, lr: float, weight_decay: float):
        import torch

        from steps import minitorch as mt

        self.torch_model, self.ours = torch_model, ours
        hp = {"lr": lr, "weight_decay": weight_decay}
        self.torch_opt = torch.optim.AdamW(torch_model.parameters(), foreach=False, **hp)
        self.ours_opt = mt.AdamW(ours.parameters(), **hp)

    def step_ours(self, idx) -> float:
        from steps.minitorch.models import shifted_targets

        self.ours_opt.zero_grad()
        loss = self.ours.loss(idx, shifted_targets(idx))
        loss.backward()
        self.ours_opt.step()
        return loss.item()

    def step_torch(self, idx) -> float:
        import torch

        self.torch_opt.zero_grad()
        ids = torch.from_numpy(idx)
        loss = self.torch_model(ids, labels=ids).loss
        loss.backward()
        self.torch_opt.step()
        return loss.item()


def run_gpt(ctx: StageRun, g: MinitorchGpt, backend: str) -> dict:
    import torch

    from steps.minitorch.models import DecoderLM
    from steps.paired import interleave, ratio_of_pairs

    torch.set_num_threads(max(ctx.threads, 1))
    tok, train, _ = load_tokens(ctx, g)
    vocab = len(tok)
    batches = [train.batch(g.batch_size, step).numpy() for step in range(g.train_steps + 1)]  # + the timed one

    def fresh(backend: str) -> Trainers:  # both engines from the same init (torch_gpt seeds)
        model = torch_gpt(ctx, g, vocab)
        return Trainers(model, DecoderLM.from_torch(model, backend), g.lr, g.weight_decay)

    model = torch_gpt(ctx, g, vocab)
    ours = DecoderLM.from_torch(model, backend)
    out = gpt_parity(model, ours, batches[0])
    for key in ("gpt_logits_err", "gpt_grad_err"):
        if out[key] > g.parity_tol:
            raise RuntimeError(f"{key} = {out[key]:.3g} on {backend}: beyond {g.parity_tol:g}")

    trainers = fresh(backend)  # fresh, same init: the trajectories start together
    rows = []
    for step in ctx.progress(range(g.train_steps), desc="same steps, both engines"):
        ours_loss, torch_loss = trainers.step_ours(batches[step]), trainers.step_torch(batches[step])
        rows.append({"step": step, "ours": ours_loss, "torch": torch_loss, "diff": abs(ours_loss - torch_loss)})
        ctx.log_metrics({"train_loss": ours_loss, "torch_train_loss": torch_loss}, step=step)
    import pandas as pd

    ctx.log_table(pd.DataFrame(rows), "loss_trajectory")
    out["loss_trajectory_err"] = max(r["diff"] for r in rows)
    out["train_loss_first"], out["train_loss_last"] = rows[0]["ours"], rows[-1]["ours"]
    if out["loss_trajectory_err"] > g.trajectory_tol:
        raise RuntimeError(f"loss trajectories part by {out['loss_trajectory_err']:.3g} (> {g.trajectory_tol:g})")

    # speed: the next steps of the same two trainers, interleaved
    x = batches[g.train_steps]
    ours_times, torch_times = interleave(lambda: trainers.step_ours(x), lambda: trainers.step_torch(x), g.pairs)
    ratio = ratio_of_pairs(ours_times, torch_times)
    out.update(ratio.as_metrics("vs_torch_eager"))
    out["tokens_per_s"] = x.size / float(np.median(ours_times))
    out["torch_tokens_per_s"] = x.size / float(np.median(torch_times))
    ctx.set_tag("vs_torch_eager", str(ratio))
    if backend != "reference" and g.vs_reference_pairs:
        fast, slow = fresh(backend), fresh("reference")
        vs_ref = ratio_of_pairs(*interleave(lambda: fast.step_ours(x), lambda: slow.step_ours(x), g.vs_reference_pairs))
        out.update(vs_ref.as_metrics("vs_reference"))
    out["vocab_size"] = vocab
    return out


def run(ctx: StageRun) -> dict:
    from steps.minitorch.config import MinitorchConfig

    p = MinitorchConfig.of(ctx.params)
    ctx.use_threads(p.job_threads)
    backend = _backend(p.backend)
    if backend == "fast":
        use_numba_threads(ctx)
    if p.kind == "ops":
        return run_ops(ctx, p, backend)
    if p.kind == "gpt":
        return run_gpt(ctx, p.gpt, backend)
    if p.kind == "classifier":
        from steps.minitorch.classify import run_classifier

        return run_classifier(ctx, p.classifier, backend)
    from steps.minitorch.translate import run_translate

    return run_translate(ctx, p.translate, backend)


STAGE = Stage.of("steps.minitorch", run, SHOWN)  # a package stage: its name is the package's
