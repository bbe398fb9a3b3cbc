"""Kaggle LLM Science Exam metrics: MAP@3, accuracy, and a bootstrap interval for either."""

from __future__ import annotations

import numpy as np

from steps.mcq.data import LETTERS


def average_precision_at_3(predicted: list[str], answer: str) -> float:
    """Kaggle's AP@3 with one correct label: 1/k for the first k<=3 where prediction k is the
    answer (a repeated correct label is not relevant again, so only its first hit counts), else 0."""
    for k, p in enumerate(predicted[:3], start=1):
        if p == answer:
            return 1.0 / k
    return 0.0


def map_at_3(predictions: list[list[str]], answers: list[str]) -> float:
    return float(np.mean([average_precision_at_3(p, a) for p, a in zip(predictions, answers)]))


def top3_letters(logits: np.ndarray) -> list[list[str]]:
    """Highest-scoring three options per row (stable on ties: earlier letter first)."""
    order = np.argsort(-np.asarray(logits), axis=-1, kind="stable")[:, :3]
    return [[LETTERS[i] for i in row] for row in order]


def per_question_scores(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(AP@3, correct@1) per question from option logits and integer labels."""
    preds = top3_letters(logits)
    answers = [LETTERS[int(y)] for y in labels]
    ap = np.array([average_precision_at_3(p, a) for p, a in zip(preds, answers)])
    acc = np.array([p[0] == a for p, a in zip(preds, answers)], dtype=float)
    return ap, acc


def bootstrap_ci(scores: np.ndarray, n: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-question scores."""
    scores = np.asarray(scores, dtype=float)
    if len(scores) == 0 or n <= 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = scores[rng.integers(0, len(scores), size=(n, len(scores)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def compute_metrics(eval_pred) -> dict[str, float]:
    """Trainer hook: MAP@3 and accuracy of an EvalPrediction (logits batch x 5, labels)."""
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    ap, acc = per_question_scores(logits, labels)
    return {"map3": float(ap.mean()), "accuracy": float(acc.mean())}
