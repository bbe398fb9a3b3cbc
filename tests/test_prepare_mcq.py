"""prepare_mcq: builtin element questions, CSV validation, hub mappers, determinism, MLflow stats."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from steps.config import stage_schema
from steps.core import InputError
from steps.mcq import data
from steps.mcq.config import PrepareMcqConfig
from steps.mcq.hf_sources import map_arc, map_openbookqa, map_sciq, to_rows
from steps.prepare_mcq import build
from tests.conftest import run_stage

LETTERS = list("ABCDE")


def defaults(**over) -> dict:
    props = stage_schema("prepare_mcq")["properties"]
    return {**{k: v["default"] for k, v in props.items()}, **over}


@pytest.fixture(scope="module")
def builtin() -> dict[str, pd.DataFrame]:
    return build(PrepareMcqConfig.of(defaults()), seed=1234)


def test_builtin_has_1000_distinct_questions_over_templates_and_disjoint_splits(builtin):
    every = pd.concat(builtin.values())
    assert len(every) >= 1000 and every["prompt"].is_unique and every["id"].is_unique
    assert every["template"].nunique() >= 10
    prompts = {s: set(df["prompt"]) for s, df in builtin.items()}
    assert not (prompts["train"] & prompts["validation"]) and not (prompts["train"] & prompts["test"])
    assert not (prompts["validation"] & prompts["test"])
    assert min(len(builtin["validation"]), len(builtin["test"])) >= 150
    for df in builtin.values():
        data.validate(df, "builtin")  # the generated files pass the same checks as user CSVs
        assert (df[LETTERS].nunique(axis=1) == 5).all(), "5 distinct options per question"
        counts = df["answer"].value_counts()
        assert counts.max() - counts.min() <= 1, "answer letters balanced within each split"


def test_builtin_context_is_relevant_but_not_a_giveaway(builtin):
    df = builtin["train"]
    answers = [r[r["answer"]] for r in df.to_dict("records")]
    assert all(a in c for a, c in zip(answers, df["context"])), "the relevant fact is in the context"
    # near-miss facts of distractors are there too: in most rows >= 2 options occur in the context
    in_ctx = [sum(r[k] in r["context"] for k in LETTERS) for r in df.to_dict("records")]
    assert sum(n >= 2 for n in in_ctx) / len(in_ctx) > 0.9


def test_reverse_questions_do_not_name_their_answer(builtin):
    df = pd.concat(builtin.values())
    rev = df[df["template"].isin(["description", "uses", "sources", "name_origin_reverse"])]
    named = [re.search(rf"\b{r[r['answer']]}\b", r["prompt"], re.IGNORECASE) for r in rev.to_dict("records")]
    assert len(rev) > 300 and not any(named)


def answer_ranks(df: pd.DataFrame, key) -> list[int]:
    """Rank (0 = smallest) of the answer among its 5 options under `key(option)`."""
    ranks = []
    for r in df.to_dict("records"):
        keys = [key(r[k]) for k in LETTERS]
        ranks.append(sorted(keys).index(keys[LETTERS.index(r["answer"])]))
    return ranks


def test_answer_rank_among_options_carries_no_information(builtin):
    """Nearby distractors once put the answer in the middle of five numbers (a no-context model
    learned 'pick the median'). Every rank of the visible numbers (atomic number, year, period and
    group) and of the option elements' atomic numbers (name options) is now equally common."""
    from steps.mcq.elements import load_elements

    z = {e["name"]: e["atomic_number"] for e in load_elements()}
    numbers = lambda o: tuple(int(n) for n in re.findall(r"\d+", o))  # noqa: E731
    keys = {
        "atomic_number": numbers,
        "discovery_year": numbers,
        "group_block": numbers,
        **{t: z.__getitem__ for t in ("symbol_reverse", "description", "sources", "name_origin_reverse")},
    }
    df = pd.concat(builtin.values())
    for template, key in keys.items():
        ranks = pd.Series(answer_ranks(df[df["template"] == template], key))
        share = ranks.value_counts(normalize=True).reindex(range(5), fill_value=0)
        assert len(ranks) >= 80 and share.between(0.15, 0.25).all(), f"{template}: rank shares {share.tolist()}"
    # the odd-format cue is gone too: 'period P, f-block' (no group) is never an option
    positions = df.loc[df["template"] == "group_block", LETTERS].to_numpy().ravel()
    assert all("group" in p for p in positions)


def test_same_seed_identical_files_other_seed_differs(tmp_path):
    params = defaults()
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    run_stage(tmp_path / "a", "prepare_mcq", params)
    run_stage(tmp_path / "b", "prepare_mcq", params)
    run_stage(tmp_path / "c", "prepare_mcq", params, common={"seed": 7})
    for split in data.SPLITS:
        a, b, c = ((tmp_path / d / "results/data/mcq" / f"{split}.csv").read_bytes() for d in "abc")
        assert a == b and a != c
    rec = json.loads((tmp_path / "a/results/prepare_mcq/main/metrics.json").read_text())
    assert rec["status"] == "ok" and rec["metrics"]["questions"] >= 1000
    # the stats really are in the job's MLflow run (real SQLite store)
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'a/results/mlflow.db'}")
    run = client.get_run(rec["run_id"])
    assert run.data.metrics["n_train"] == rec["metrics"]["n_train"]
    assert run.data.metrics["train_answer_A"] > 0 and "template_symbol" in run.data.metrics


GOOD = "id,prompt,A,B,C,D,E,answer\n1,Q one?,a,b,c,d,e,A\n2,Q two?,a,b,c,d,e,C\n"


@pytest.mark.parametrize(
    "text, row, column",
    [
        (GOOD.replace(",D,E,answer", ",E,answer").replace("d,e", "e"), 0, "D"),  # missing column
        (GOOD.replace("e,C\n", "e,F\n"), 2, "answer"),  # answer not in A-E
        (GOOD.replace("Q two?,a,b,c,d", "Q two?,a,b,,d"), 2, "C"),  # empty option
        (GOOD.replace("2,Q two?", "1,Q two?"), 2, "id"),  # duplicate id
    ],
)
def test_malformed_csv_names_file_row_and_column(tmp_path, text, row, column):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        data.read_csv(path)
    msg = str(exc.value)
    assert str(path) in msg and f"row {row} column {column}:" in msg, msg


def test_stage_stops_on_malformed_csv_with_one_error_and_failed_run(tmp_path):
    import mlflow

    path = tmp_path / "bad.csv"
    path.write_text(GOOD.replace("e,C\n", "e,F\n"))
    proc = run_stage(tmp_path, "prepare_mcq", defaults(source=str(path)), check=False)
    assert proc.returncode == 1 and f"{path} row 2 column answer" in proc.stderr
    assert "Traceback" not in proc.stderr
    failed = json.loads((tmp_path / "results/prepare_mcq/main/failed.json").read_text())
    run = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'results/mlflow.db'}").get_run(failed["run_id"])
    assert run.info.status == "FAILED"


def test_kaggle_csv_and_folder_sources(tmp_path):
    rows = [
        {"id": i, "prompt": f"Question {i}?", **{k: f"{k}{i}" for k in LETTERS}, "answer": LETTERS[i % 5]}
        for i in range(40)
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "one.csv", index=False)
    one = build(PrepareMcqConfig.of(defaults(source=str(tmp_path / "one.csv"))), seed=1)
    assert sum(map(len, one.values())) == 40 and len(one["test"]) == 6
    kaggle = tmp_path / "kaggle"
    kaggle.mkdir()
    pd.DataFrame(rows).to_csv(kaggle / "train.csv", index=False)
    pd.DataFrame(rows[:5]).drop(columns="answer").to_csv(kaggle / "test.csv", index=False)
    splits = build(PrepareMcqConfig.of(defaults(source=str(kaggle))), seed=1)
    assert len(splits["test"]) == 5 and "answer" not in splits["test"]
    assert len(splits["train"]) + len(splits["validation"]) == 40


def vary(row: dict, i: int) -> dict:
    """The i-th distinct copy of a hub row: every text field gets a suffix."""
    out = {}
    for k, v in row.items():
        if isinstance(v, str) and k not in ("answerKey", "id"):
            v = f"{v} {i}"
        elif isinstance(v, dict):
            v = {**v, "text": [f"{t} {i}" for t in v["text"]]}
        out[k] = v
    return out


def test_hub_rows_map_to_five_options():
    sciq = {
        "question": "What gas do plants take in?",
        "distractor1": "oxygen",
        "distractor2": "helium",
        "distractor3": "neon",
        "correct_answer": "carbon dioxide",
        "support": "Plants use CO2.",
    }
    obqa = {
        "id": "7",
        "question_stem": "The sun is a",
        "choices": {"text": ["star", "planet", "moon", "comet"], "label": ["A", "B", "C", "D"]},
        "answerKey": "A",
        "fact1": "the sun is a star",
    }
    arc = {
        "id": "x",
        "question": "Which is a metal?",
        "choices": {"text": ["wood", "iron", "glass"], "label": ["1", "2", "3"]},
        "answerKey": "2",
    }
    assert map_sciq(sciq)["answer_text"] == "carbon dioxide" and map_sciq(sciq)["context"] == "Plants use CO2."
    assert map_openbookqa(obqa)["answer_text"] == "star" and len(map_openbookqa(obqa)["distractors"]) == 3
    assert map_arc(arc)["answer_text"] == "iron" and map_arc(arc)["distractors"] == ["wood", "glass"]
    for sample in (sciq, obqa, arc):
        rows = [vary(sample, i) for i in range(10)]
        mapped = to_rows(rows, seed=3)
        kaggle = data.assign_letters({"test": mapped}, seed=3, prefix="hf-")["test"]
        data.validate(kaggle, "hub")
        assert (kaggle[LETTERS].nunique(axis=1) == 5).all()
        truth = mapped["answer_text"].tolist()
        assert [r[r["answer"]] for r in kaggle.to_dict("records")] == truth
