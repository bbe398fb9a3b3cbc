"""Evaluation and bookkeeping for mcq_finetune: test scores with bootstrap intervals, per-template
breakdown, the Kaggle submission file, and training throughput/MFU."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from steps.analytic.flops import flops_per_token
from steps.core import StageRun
from steps.mcq.metrics import bootstrap_ci, per_question_scores, top3_letters
from steps.mcq.model import non_embedding_params

matplotlib.use("Agg")  # jobs draw to files, never to a display
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

CHANCE_MAP3 = (1 + 1 / 2 + 1 / 3) / 5  # uniform random ranking of 5 options: 0.367


def log_by_template(ctx: StageRun, templates, ap, acc, split: str) -> None:
    """Which question kinds the model gets right: a table and a bar chart per template."""
    df = (
        pd.DataFrame({"template": list(templates), "map3": ap, "accuracy": acc})
        .groupby("template")
        .agg(questions=("map3", "size"), map3=("map3", "mean"), accuracy=("accuracy", "mean"))
        .reset_index()
    )
    ctx.log_table(df, f"{split}_by_template")
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(df) + 1.2))
    ax.barh(df["template"], df["map3"], color="tab:blue")
    ax.axvline(CHANCE_MAP3, color="gray", ls="--", label=f"chance {CHANCE_MAP3:.3f}")
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"{split} MAP@3")
    ax.set_title(f"mcq_finetune {ctx.cell}: {split} MAP@3 by question template")
    ax.legend(loc="lower right")
    ctx.log_figure(fig, f"{split}_by_template")
    plt.close(fig)


def evaluate_split(trainer, ds, split: str, ctx: StageRun, n_boot: int, templates=None) -> tuple[dict, object]:
    """Predict a split; MAP@3/accuracy with bootstrap CIs when it has answers."""
    pred = trainer.predict(ds, metric_key_prefix=split)
    if pred.label_ids is None:
        return {}, pred.predictions
    ap, acc = per_question_scores(pred.predictions, pred.label_ids)
    if templates is not None:
        log_by_template(ctx, templates[: len(ap)], ap, acc, split)
    out = {f"{split}_map3": float(ap.mean()), f"{split}_accuracy": float(acc.mean()), f"{split}_questions": len(ap)}
    for name, scores in (("map3", ap), ("accuracy", acc)):
        lo, hi = bootstrap_ci(scores, n=n_boot, seed=ctx.seed)
        out[f"{split}_{name}_lo"], out[f"{split}_{name}_hi"] = lo, hi
    return out, pred.predictions


def validation_scores(trainer, trained: bool) -> dict:
    """Validation MAP@3/accuracy: the best epoch's evaluation when trained (no second pass),
    else one evaluation of the zero-shot model."""
    if trained:
        best = [h for h in trainer.state.log_history if h.get("eval_map3") == trainer.state.best_metric]
        logs = best[-1] if best else {}
    else:
        logs = trainer.evaluate()
    return {"validation_map3": logs.get("eval_map3"), "validation_accuracy": logs.get("eval_accuracy")}


def write_submission(rows, logits, path: Path) -> Path:
    """Kaggle `id,prediction` (top-3 letters) in the CSV's row order (`rows.index`)."""
    order = np.argsort(rows.index.to_numpy(), kind="stable")
    top3 = top3_letters(np.asarray(logits)[order])
    pd.DataFrame({"id": rows["id"].to_numpy()[order], "prediction": [" ".join(t) for t in top3]}).to_csv(
        path, index=False, lineterminator="\n"
    )
    return path


def throughput(trainer, meter, model, peak: float) -> dict:
    """Examples/s over optimizer-step time and MFU = achieved FLOP/s / measured matmul peak."""
    if not trainer.examples or not meter.step_time:
        return {}
    cfg = model.config
    seq = trainer.tokens / (trainer.examples * 5)  # mean padded length of one (question, option) pair
    flops = trainer.tokens * flops_per_token(
        non_embedding_params(model), cfg.num_hidden_layers, cfg.hidden_size, int(round(seq))
    )
    return {
        "train_examples_per_s": trainer.examples / meter.step_time,
        "train_tokens_per_s": trainer.tokens / meter.step_time,
        "train_step_time_s": meter.step_time,
        "train_examples": trainer.examples,
        "mean_padded_len": seq,
        "achieved_flops": flops / meter.step_time,
        "peak_flops": peak,
        "mfu": flops / meter.step_time / peak,
    }
