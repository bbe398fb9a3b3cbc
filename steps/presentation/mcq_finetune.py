"""What the mcq_finetune stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

SHOWN = Presentation(
    columns={
        "backbone": "info.backbone",
        "context": "info.context",
        "mode": "info.mode",
        "precision": "info.precision",  # precision: auto picks by a bf16 probe on a CPU (configs/README.md)
        "MAP@3": "metrics.test_map3",
        # over seeds in the MAP@3 column (a seed group); this one is the first seed's, over test questions
        "MAP@3 (first seed, CI over questions)": "info.test_map3_ci",
        "accuracy": "metrics.test_accuracy",
        "test questions": "metrics.test_questions",
        "train examples/s": "metrics.train_examples_per_s",
        "MFU": "metrics.mfu",
        "wall time (s)": "metrics.wall_time_s",
    },
    # each cell against the one without context and against zero-shot (where selected): paired over
    # the seeds both trained, "higher"/"lower" beyond seed noise or "not decided" (steps/report/gather.py)
    derived={
        "MAP@3 Δ no context": ("diff", "MAP@3", "finetuned_no_context"),
        "MAP@3 Δ zero-shot": ("diff", "MAP@3", "zero_shot_context"),
    },
    headline=("best test MAP@3 (chance 0.367)", "MAP@3", "max"),
    headline_of=("test questions", "test questions"),
    curves=["loss"],  # validation MAP@3 is evaluated once an epoch: a point, not a curve, at 1 epoch
    system_metrics=True,  # a training job: CPU, memory (GPU on CUDA) in its run's system metrics
    tables=["test_by_template", "seeds"],  # seeds: each seed's outcomes (a seed group)
)
