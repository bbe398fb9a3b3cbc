"""mcq_finetune: Kaggle LLM Science Exam with HF Trainer + AutoModelForMultipleChoice.

Cells: zero-shot (pretrained encoder, untrained head) vs fine-tuned, with vs without context.
Per cell: MAP@3 and accuracy on validation (each epoch; zero-shot cells only when test has no
answers) and on test with a 95 % bootstrap interval,
the best checkpoint under <out>/best, a Kaggle submission.csv, training examples/s and MFU.
"""

from __future__ import annotations

import shutil

from steps.core import Stage, StageRun
from steps.hardware import matmul_peak_flops
from steps.mcq import data
from steps.mcq.config import McqFinetuneConfig
from steps.mcq.evaluate import CHANCE_MAP3, evaluate_split, throughput, validation_scores, write_submission
from steps.mcq.features import MultipleChoiceCollator
from steps.mcq.metrics import compute_metrics
from steps.mcq.model import load
from steps.mcq.train import (
    CountingTrainer,
    Throughput,
    ToStageRun,
    keep_only_best,
    peak_dtype,
    to_datasets,
    training_args,
)
from steps.presentation.mcq_finetune import SHOWN


def run(ctx: StageRun) -> dict:
    # torch is imported (steps.mcq.*) before the job seeds it: the untrained head's init depends on it
    p, device = McqFinetuneConfig.of(ctx.params), ctx.device  # device raises SkipCell on a CUDA cell without CUDA
    splits = data.load_splits(ctx.inputs["data"], p.val_fraction, ctx.seed)
    tok, model, described = load(p.backbone, p.allow_hub, p.pooling, p.dropout)
    ds, rows = to_datasets(
        splits,
        tok,
        p.use_context,
        p.max_length,
        {"train": p.max_train, "validation": p.max_eval, "test": p.max_eval},
    )
    train = p.train and "train" in ds
    args, precision, chosen = training_args(p, ctx.out, ctx.seed, device, train)
    meter = Throughput()
    trainer = CountingTrainer(
        model=model,
        args=args,
        train_dataset=ds["train"] if train else None,
        eval_dataset=ds["validation"],
        data_collator=MultipleChoiceCollator(tok),
        processing_class=tok,
        compute_metrics=compute_metrics,
        callbacks=[meter, ToStageRun(ctx)],
    )
    ctx.info.update(
        backbone=p.backbone,
        context="yes" if p.use_context else "no",
        mode="fine-tuned" if train else "zero-shot",
        model=described,
        precision=precision,
        precision_chosen=chosen,
        model_class=type(model).__name__,
    )
    metrics = {
        "chance_map3": CHANCE_MAP3,
        "params": sum(t.numel() for t in model.parameters()),
        **{f"n_{k}": len(v) for k, v in ds.items()},
    }
    if train:
        peak = matmul_peak_flops(peak_dtype(precision), device.type, n=p.peak_matmul_size)
        result = trainer.train()
        metrics.update(train_loss=result.training_loss, train_runtime_s=result.metrics["train_runtime"])
        metrics.update(throughput(trainer, meter, model, peak))
        if p.keep_checkpoint:  # a seed group's further seeds keep none: the first seed's is the cell's
            best = keep_only_best(trainer, ctx.out)
            if ctx.extra_seed:
                shutil.rmtree(best, ignore_errors=True)
            else:
                ctx.info["checkpoint"] = str(best)
    test_scored = "test" in ds and "label" in ds["test"].column_names
    if train or not test_scored:  # zero-shot selects nothing: its validation pass would only repeat
        metrics.update(validation_scores(trainer, train))  # the test's (a third of the cell's time)
    if "test" in ds:
        templates = rows["test"]["template"].tolist() if "template" in rows["test"] else None
        scores, logits = evaluate_split(trainer, ds["test"], "test", ctx, p.bootstrap, templates)
        metrics.update(scores)
        sub = write_submission(rows["test"], logits, ctx.out / "submission.csv")
        ctx.log_artifact(sub)
        if "test_map3" in metrics:
            ctx.info["test_map3_ci"] = (
                f"{metrics['test_map3']:.3f} [{metrics['test_map3_lo']:.3f}, {metrics['test_map3_hi']:.3f}]"
            )
        else:
            ctx.info["test_map3_ci"] = "predictions only (test has no answers)"
    return metrics


STAGE = Stage.of(__spec__.name, run, SHOWN)

if __name__ == "__main__":
    STAGE.main()
