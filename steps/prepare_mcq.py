"""prepare_mcq: Kaggle LLM Science Exam CSVs (train/validation/test) for mcq_finetune.

Sources (`prepare_mcq.source`):
  builtin:elements       questions generated from mendeleev's elements.db (offline default)
  <file.csv>             one Kaggle-format CSV, split here
  <dir>                  a Kaggle folder with train.csv (+ test.csv): validation carved from train
  hf:<path>[:<name>]     SciQ / OpenBookQA / ARC from the hub, mapped to A-E
No question lands in two splits; the same seed gives byte-identical files.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from steps.core import InputError, Stage, StageRun
from steps.mcq import data
from steps.mcq.config import PrepareMcqConfig
from steps.mcq.elements import generate
from steps.mcq.hf_sources import load_hub
from steps.presentation.prepare_mcq import SHOWN


def build(p: PrepareMcqConfig, seed: int) -> dict[str, pd.DataFrame]:
    """The three splits for a configured source."""
    source = p.source
    fractions = {"validation": p.val_fraction, "test": p.test_fraction}
    if source == "builtin:elements":
        df = generate(seed, p.templates, p.context_facts, p.distractor_pool)
        # split by element: no element's facts (hence no question) are shared across splits;
        # the element column is dropped afterwards since it would name the answer
        parts = data.split_groups(df, "element", fractions, seed)
        return data.assign_letters({k: v.drop(columns="element") for k, v in parts.items()}, seed)
    if source.startswith("hf:"):
        df = data.dedupe_prompts(load_hub(source, seed, p.max_questions))
        splits = data.assign_letters(data.split_groups(df, "prompt", fractions, seed), seed, "hf-")
        return {k: data.validate(v, f"{source} ({k})") for k, v in splits.items()}
    if source.startswith("builtin:"):
        raise InputError(f"prepare_mcq.source {source!r}: unknown builtin (only builtin:elements)")
    path = Path(source)
    if path.is_dir():
        return data.load_splits(path, p.val_fraction, seed)
    df = data.dedupe_prompts(data.read_csv(path))
    return data.split_groups(df, "prompt", fractions, seed)


def stats(splits: dict[str, pd.DataFrame]) -> tuple[dict, pd.DataFrame]:
    """Counts per split, per template and per answer letter (the MLflow metrics and table)."""
    metrics, rows = {}, []
    for name, df in splits.items():
        metrics[f"n_{name}"] = len(df)
        letters = df["answer"].value_counts() if "answer" in df else pd.Series(dtype=int)
        for letter in data.LETTERS:
            metrics[f"{name}_answer_{letter}"] = int(letters.get(letter, 0))
        groups = df.groupby("template").size() if "template" in df else pd.Series({"all": len(df)})
        for template, n in groups.items():
            rows.append({"split": name, "template": template, "questions": int(n)})
    every = pd.concat(splits.values())
    metrics["questions"] = len(every)
    if "answer" in every and every["answer"].str.len().gt(0).all():
        counts = every["answer"].value_counts().reindex(list(data.LETTERS), fill_value=0)
        metrics["answer_balance"] = float(counts.max() / max(counts.min(), 1))
    if "template" in every:
        metrics["n_templates"] = int(every["template"].nunique())
        for template, n in every.groupby("template").size().items():
            metrics[f"template_{template}"] = int(n)
    if "context" in every:
        metrics["context_chars_mean"] = float(every["context"].str.len().mean())
    return metrics, pd.DataFrame(rows)


def run(ctx: StageRun) -> dict:
    p = PrepareMcqConfig.of(ctx.params)
    splits = build(p, ctx.seed)
    overlap = set(splits["train"]["prompt"]) & set().union(*(set(splits[s]["prompt"]) for s in splits if s != "train"))
    if overlap:
        raise InputError(f"{len(overlap)} questions appear in train and another split, e.g. {next(iter(overlap))!r}")
    files = data.write_splits(splits, ctx.outputs["data"])
    metrics, table = stats(splits)
    ctx.log_metrics(metrics)
    ctx.log_table(table, "questions_per_template")
    ctx.info.update(source=p.source, files={k: str(v) for k, v in files.items()})
    for f in files.values():
        ctx.log_artifact(f, "data")
    print(f"prepare_mcq: {metrics['questions']} questions -> {', '.join(f'{k}={len(v)}' for k, v in splits.items())}")
    return metrics


STAGE = Stage.of(__spec__.name, run, SHOWN)

if __name__ == "__main__":
    STAGE.main()
