"""Hub science-QA sets mapped to the Kaggle A-E format (SciQ, OpenBookQA, ARC).

Each mapper turns one dataset row into (prompt, answer text, distractor texts, context). Sets
with fewer than 5 options get extra distractors shuffled in: correct answers of other questions
of the same set, which have the right "kind" far more often than random text.
"""

from __future__ import annotations

import random

import datasets
import pandas as pd

from steps.core import InputError


def map_sciq(row: dict) -> dict:
    return {
        "prompt": row["question"],
        "answer_text": row["correct_answer"],
        "distractors": [row["distractor1"], row["distractor2"], row["distractor3"]],
        "context": row.get("support") or "",
    }


def _labelled(row: dict, prompt: str, context: str = "") -> dict:
    """OpenBookQA/ARC rows: choices {text: [...], label: [...]} and an answerKey among the labels."""
    texts, labels = list(row["choices"]["text"]), [str(x) for x in row["choices"]["label"]]
    key = str(row["answerKey"])
    if key not in labels:
        raise ValueError(f"answerKey {key!r} not among labels {labels}")
    k = labels.index(key)
    return {"prompt": prompt, "answer_text": texts[k], "distractors": texts[:k] + texts[k + 1 :], "context": context}


def map_openbookqa(row: dict) -> dict:
    return _labelled(row, row["question_stem"], row.get("fact1") or "")


def map_arc(row: dict) -> dict:
    return _labelled(row, row["question"])


def detect(columns) -> callable:
    cols = set(columns)
    if {"question", "correct_answer", "distractor1"} <= cols:
        return map_sciq
    if {"question_stem", "choices", "answerKey"} <= cols:
        return map_openbookqa
    if {"question", "choices", "answerKey"} <= cols:
        return map_arc
    raise InputError(
        f"hf dataset columns {sorted(cols)} match no known science-QA layout "
        "(SciQ, OpenBookQA, ARC); use a Kaggle CSV path instead"
    )


def to_rows(rows: list[dict], seed: int) -> pd.DataFrame:
    """Map hub rows to questions with exactly 4 distractors (padded from other questions'
    answers); letters are assigned after splitting (steps.mcq.data.assign_letters)."""
    if not rows:
        raise InputError("hf dataset has no rows")
    rng = random.Random(seed)
    mapper = detect(rows[0].keys())
    mapped = [mapper(r) for r in rows]
    pool = sorted({m["answer_text"] for m in mapped})  # other questions' answers: the right "kind"
    for m in mapped:
        opts = [d for d in dict.fromkeys(m["distractors"]) if d and d != m["answer_text"]][:4]
        spare = [a for a in pool if a != m["answer_text"] and a not in opts]
        if len(opts) + len(spare) < 4:
            raise InputError(
                f"hf question {m['prompt'][:60]!r}: fewer than 5 distinct options even "
                "after borrowing other answers; use more rows (max_questions)"
            )
        m["distractors"] = opts + rng.sample(spare, 4 - len(opts))
    return pd.DataFrame(mapped)


def load_hub(spec: str, seed: int, max_questions: int = 0) -> pd.DataFrame:
    """`hf:<path>[:<name>]` -> all splits concatenated and mapped (re-split by the caller)."""
    path, _, name = spec.removeprefix("hf:").partition(":")
    try:
        dd = datasets.load_dataset(path, name or None)
    except Exception as exc:  # noqa: BLE001 - any hub/network failure becomes one clear message
        raise InputError(
            f"prepare_mcq.source {spec!r}: cannot load from the hub ({type(exc).__name__}: "
            f"{str(exc)[:200]}); needs network/HF cache, or use builtin:elements or a CSV path"
        ) from None
    rows = [r for split in sorted(dd) for r in dd[split]]
    if max_questions:
        rows = random.Random(seed).sample(rows, min(max_questions, len(rows)))
    return to_rows(rows, seed)
