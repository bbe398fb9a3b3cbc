"""Kaggle LLM Science Exam CSVs: validate, split, read and write.

Format: `id,prompt,A,B,C,D,E,answer` plus an optional `context` (and any extra columns, e.g.
`template`, which are carried along). Every reader goes through `read_csv`, so a malformed file
stops with ONE error naming the file, the row (1-based data row; the header is row 0) and the column.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from steps.core import InputError

LETTERS = ("A", "B", "C", "D", "E")
REQUIRED = ("id", "prompt", *LETTERS)
SPLITS = ("train", "validation", "test")
FIX = "fix the CSV or point prepare_mcq.source at a Kaggle-format file (id,prompt,A,B,C,D,E,answer[,context])"


def _bad(path, row, column, what) -> InputError:
    return InputError(f"{path} row {row} column {column}: {what}; {FIX}")


def validate(df: pd.DataFrame, path: str | Path, require_answer: bool = True) -> pd.DataFrame:
    """Check columns, empty cells, answer letters, duplicate ids; return the frame as strings."""
    missing = [c for c in REQUIRED + (("answer",) if require_answer else ()) if c not in df.columns]
    if missing:
        raise _bad(path, 0, missing[0], f"missing column (header has {list(df.columns)})")
    df = df.fillna("").astype(str)
    seen: dict[str, int] = {}
    for i, rec in enumerate(df.to_dict("records"), start=1):
        for col in ("id", "prompt", *LETTERS):
            if not rec[col].strip():
                raise _bad(path, i, col, "empty " + ("option" if col in LETTERS else "value"))
        if "answer" in df.columns and (require_answer or rec["answer"].strip()):
            if rec["answer"].strip() not in LETTERS:
                raise _bad(path, i, "answer", f"answer {rec['answer']!r} is not one of A-E")
        if rec["id"] in seen:
            raise _bad(path, i, "id", f"duplicate id {rec['id']!r} (first at row {seen[rec['id']]})")
        seen[rec["id"]] = i
    if "answer" in df.columns:
        df["answer"] = df["answer"].str.strip()
    return df


def read_csv(path: str | Path, require_answer: bool = True) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: file not found; {FIX}")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:  # a 0-byte file: pandas' own message names no file
        raise InputError(f"{path}: empty file (0 bytes, not even a header row); {FIX}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} row ? column ?: not a readable CSV ({exc}); {FIX}") from None
    if len(df) == 0:
        raise InputError(f"{path} row 1 column id: no data rows; {FIX}")
    return validate(df, path, require_answer)


def write_splits(splits: dict[str, pd.DataFrame], out: str | Path) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, df in splits.items():
        files[name] = out / f"{name}.csv"
        df.to_csv(files[name], index=False, lineterminator="\n")
    return files


def split_groups(df: pd.DataFrame, key: str, fractions: dict[str, float], seed: int) -> dict[str, pd.DataFrame]:
    """Split rows by a group key (e.g. element or prompt) so no group lands in two splits."""
    groups = sorted(df[key].unique().tolist(), key=str)
    random.Random(seed).shuffle(groups)
    n = len(groups)
    n_val = max(1, round(n * fractions["validation"])) if fractions["validation"] > 0 else 0
    n_test = max(1, round(n * fractions["test"])) if fractions["test"] > 0 else 0
    if n - n_val - n_test < 1:
        raise InputError(f"only {n} distinct questions/groups: too few to split into train/validation/test")
    which = {g: "validation" for g in groups[:n_val]}
    which.update({g: "test" for g in groups[n_val : n_val + n_test]})
    label = df[key].map(lambda g: which.get(g, "train"))
    return {s: df[label == s].reset_index(drop=True) for s in SPLITS}


def dedupe_prompts(df: pd.DataFrame) -> pd.DataFrame:
    """Distinct questions only: the same prompt twice (even with other options) counts once."""
    norm = df["prompt"].str.lower().str.split().str.join(" ")
    return df[~norm.duplicated()].reset_index(drop=True)


def place_answer(answer: str, distractors: list[str], letter: str, rng: random.Random) -> dict[str, str]:
    """Options A-E with `answer` under `letter` and the distractors shuffled into the rest."""
    others = list(distractors)
    rng.shuffle(others)
    k = LETTERS.index(letter)
    return dict(zip(LETTERS, others[:k] + [answer] + others[k:]))


def assign_letters(splits: dict[str, pd.DataFrame], seed: int, prefix: str = "") -> dict[str, pd.DataFrame]:
    """Generated questions (answer_text + 4 distractors) -> Kaggle rows. Letters are balanced
    within every split (counts differ by at most one) and ids are unique across splits."""
    rng = random.Random(seed)
    out, next_id = {}, 0
    for name, df in splits.items():
        letters = [LETTERS[i % 5] for i in range(len(df))]
        rng.shuffle(letters)
        rows = []
        for rec, letter in zip(df.to_dict("records"), letters):
            extra = {k: v for k, v in rec.items() if k not in ("prompt", "answer_text", "distractors")}
            rows.append(
                {
                    "id": f"{prefix}{next_id}",
                    "prompt": rec["prompt"],
                    **place_answer(rec["answer_text"], rec["distractors"], letter, rng),
                    "answer": letter,
                    **extra,
                }
            )
            next_id += 1
        out[name] = pd.DataFrame(rows, columns=["id", "prompt", *LETTERS, "answer", *extra])
    return out


def load_splits(path: str | Path, val_fraction: float = 0.15, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Read MCQ splits from a folder: train/validation/test.csv as prepare_mcq writes them, or a
    Kaggle folder with train.csv (+ test.csv, answer optional): validation is then carved from
    train. A single CSV file is used as the test split (predictions only if it has no answer)."""
    path = Path(path)
    if path.is_file():
        return {"test": read_csv(path, require_answer=False)}
    if not path.is_dir():
        raise InputError(f"{path}: no such MCQ file or folder; run prepare_mcq or set the data path in config")
    files = {s: path / f"{s}.csv" for s in SPLITS}
    if not files["train"].exists():
        raise InputError(f"{path}: no train.csv; expected train.csv [validation.csv] [test.csv]")
    train = read_csv(files["train"])
    test = read_csv(files["test"], require_answer=False) if files["test"].exists() else None
    if files["validation"].exists():
        out = {"train": train, "validation": read_csv(files["validation"])}
    else:  # Kaggle folder: carve validation (and test, if there is no test.csv) from train.csv
        fractions = {"validation": val_fraction, "test": 0.0 if test is not None else val_fraction}
        out = split_groups(train, "id", fractions, seed)
    if test is not None:
        out["test"] = test
    return out
