"""Seed groups: a cell trained under N seeds reports each outcome's mean with its 95 % interval
(steps/core/seeds.py), every verdict between cells is decided by those intervals, compare carries the
seeds, and the smoke DAG runs two seed groups end to end (gpt_train, one mcq_finetune cell)."""

from __future__ import annotations

import json
import math
import time

import pandas as pd
import pytest

from steps.compare import compare
from steps.core.seeds import NOT_DECIDED, against, aggregate, interval, verdict_of_intervals
from steps.core.seeds import compare as seed_compare
from steps.core.stage import Presentation
from steps.report.gather import SEEDS, VERDICT, headline, stage_table
from steps.report.render import with_seed_intervals
from steps.tracking import store as tracking_store
from steps.tracking.mlflow_run import MlflowRun
from tests.conftest import mlflow_runs


def test_interval_against_a_hand_computation():
    """1, 2, 3, 4: mean 2.5, sd √(5/3), t(0.975, 3 df) = 3.182446 (a t-table's value): ± 2.054261."""
    iv = interval([1.0, 2.0, 3.0, 4.0])
    sd = math.sqrt(5 / 3)
    half = 3.182446305284263 * sd / 2
    assert (iv.mean, iv.n) == (2.5, 4)
    assert iv.sd == pytest.approx(sd, rel=1e-12)
    assert (iv.low, iv.high) == (pytest.approx(2.5 - half, rel=1e-9), pytest.approx(2.5 + half, rel=1e-9))
    assert iv.text() == "2.5 [0.4457, 4.554] (4 seeds)"
    one = interval([7.0])
    assert not one.decided and one.text() == "7 (1 seed: no interval)"


def test_aggregate_means_intervals_and_measured_keys():
    """Outcomes: mean, sd, interval where the seeds differ; a count every seed gave alike keeps its
    value alone; a timing is the first seed's (the machine moves it, not the seed)."""
    out = aggregate(
        [
            {"val_loss": 5.0, "n_params": 100.0, "tokens_per_s": 10.0, "mfu": 0.1},
            {"val_loss": 5.2, "n_params": 100.0, "tokens_per_s": 30.0, "mfu": 0.3},
            {"val_loss": 5.1, "n_params": 100.0, "tokens_per_s": 20.0, "mfu": 0.2},
        ]
    )
    iv = interval([5.0, 5.2, 5.1])
    assert out["val_loss"] == pytest.approx(5.1) and out["val_loss_low"] == pytest.approx(iv.low)
    assert out["val_loss_high"] == pytest.approx(iv.high) and out["val_loss_sd"] == pytest.approx(0.1)
    assert out["n_params"] == 100.0 and "n_params_sd" not in out
    assert (out["tokens_per_s"], out["mfu"]) == (10.0, 0.1) and "mfu_low" not in out
    assert out["seeds"] == 3.0


def test_verdicts_flip_to_not_decided_when_intervals_overlap():
    far, near = [0.50, 0.52, 0.51], [0.40, 0.41, 0.42]
    assert seed_compare(far, near) == "a better" and seed_compare(near, far) == "b better"
    assert seed_compare(far, near, higher_is_better=False) == "b better"  # a loss: lower wins
    overlapping = [0.45, 0.55, 0.50]
    assert seed_compare(overlapping, [0.44, 0.56, 0.49], paired=False) == NOT_DECIDED
    # paired over shared seeds: a seed moves both cells alike; the per-seed differences decide
    a, b = [0.40, 0.60, 0.50], [0.39, 0.588, 0.489]
    assert seed_compare(a, b, paired=False) == NOT_DECIDED and seed_compare(a, b, paired=True) == "a better"
    assert seed_compare([0.5], [0.4]) == NOT_DECIDED  # one seed each: no interval
    assert against([0.50, 0.52, 0.51], 0.367) == "met" and against([0.30, 0.32, 0.31], 0.367) == "missed"
    assert against([0.2, 0.5, 0.4], 0.367) == NOT_DECIDED
    assert verdict_of_intervals((1, 2), (3, 4)) == "b better" and verdict_of_intervals((1, 3), (2, 4)) == NOT_DECIDED


def record(cell: str, mean: float, low: float, high: float, seeds: int = 3) -> dict:
    sd = (high - low) / 4
    metrics = {"map3": mean, "map3_low": low, "map3_high": high, "map3_sd": sd, "seeds": seeds}
    return {"stage": "s", "cell": cell, "status": "ok", "run_id": f"r{cell}", "metrics": metrics, "info": {}}


SHOWN = Presentation(
    columns={"MAP@3": "metrics.map3"},
    derived={"Δ base": ("diff", "MAP@3", "base")},
    headline=("best MAP@3", "MAP@3", "max"),
)


def test_report_rows_show_intervals_and_decide_verdicts(tmp_path):
    """A clear gap: 'higher' beyond noise, the headline ahead of the runner-up; overlapping intervals:
    'not decided' in both places; the rendered cell reads 'mean [low, high] (n seeds)'."""
    clear = {"base": record("base", 0.40, 0.38, 0.42), "ctx": record("ctx", 0.51, 0.49, 0.53)}
    table = stage_table(clear, pd.DataFrame(), SHOWN)
    assert table.loc[table["cell"] == "ctx", "MAP@3" + SEEDS].iloc[0] == "[0.49, 0.53] (3 seeds)"
    assert table.loc[table["cell"] == "ctx", "Δ base" + VERDICT].iloc[0] == "higher"
    assert "ahead of base beyond seed noise" in headline(table, SHOWN)[1]
    shown = with_seed_intervals(table)
    assert shown.loc[shown["cell"] == "ctx", "MAP@3"].iloc[0] == "0.51 [0.49, 0.53] (3 seeds)"
    assert "MAP@3" + SEEDS not in shown
    close = {"base": record("base", 0.50, 0.45, 0.55), "ctx": record("ctx", 0.51, 0.46, 0.56)}
    table = stage_table(close, pd.DataFrame(), SHOWN)
    assert table.loc[table["cell"] == "ctx", "Δ base" + VERDICT].iloc[0] == NOT_DECIDED
    assert "not decided against base" in headline(table, SHOWN)[1]
    # the per-seed outcomes (each cell's seeds.csv) decide paired where they are at hand
    for cell, values in {"base": [0.45, 0.55, 0.50], "ctx": [0.46, 0.56, 0.51]}.items():
        (tmp_path / cell).mkdir()
        pd.DataFrame({"seed": [1, 2, 3], "map3": values}).to_csv(tmp_path / cell / "seeds.csv", index=False)
    table = stage_table(close, pd.DataFrame(), SHOWN, {c: tmp_path / c for c in close})
    assert table.loc[table["cell"] == "ctx", "Δ base" + VERDICT].iloc[0] == "higher"


def test_one_seed_beside_seed_groups_says_so():
    one = record("base", 0.40, 0.38, 0.42, seeds=3)
    lone = {**record("ctx", 0.51, 0.51, 0.51, seeds=1)}
    lone["metrics"] = {"map3": 0.51, "seeds": 1}
    table = stage_table({"base": one, "ctx": lone}, pd.DataFrame(), SHOWN)
    assert "(1 seed: no interval)" in headline(table, SHOWN)[1]


def seed_group_job(uri: str, cell: str, values: list[float]) -> str:
    """A cell's run as the job writes a seed group: the means with `_sd`/`_low`/`_high` and `seeds`."""
    iv = interval(values)
    run = MlflowRun(uri, "gpt_train", cell, "hash", 0)
    run.start({"lr": 1e-3}, {"seed": 0})
    m = {"val_loss_final": iv.mean, "val_loss_final_sd": iv.sd, "val_loss_final_low": iv.low}
    run.log_metrics({**m, "val_loss_final_high": iv.high, "seeds": float(len(values))})
    run.end("ok")
    time.sleep(0.01)
    return run.run_id


def test_compare_judges_learning_outcomes_by_their_seed_intervals(tmp_path, monkeypatch):
    """`--vs previous` after `--config seed=7`: a loss that moved within its seed spread reads within
    noise; one that moved beyond it reads down; each row carries its seeds."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking_store.client(uri)
    lab = tracking_store.experiment_id(client, "lab", uri)

    def lab_run(cells: dict[str, list[float]]) -> None:
        run = client.create_run(lab, tags={"mlflow.runName": "lab"})
        for cell, values in cells.items():
            seed_group_job(uri, cell, values)
        client.set_terminated(run.info.run_id, "FINISHED")
        time.sleep(0.01)

    lab_run({"main": [5.80, 5.90, 5.85], "wide": [5.80, 5.90, 5.85]})
    lab_run({"main": [5.84, 5.92, 5.88], "wide": [5.10, 5.15, 5.12]})  # seed=7: main within noise
    data = json.loads(compare(["gpt_train"], uri, vs="previous", fmt="json"))
    rows = {r["cell"]: r for r in data["stages"]["gpt_train"]}
    assert rows["main"]["val loss end noise"] == "within" and rows["wide"]["val loss end noise"] == "down"
    assert rows["main"]["seeds"] == 3
    text = compare(["gpt_train"], uri, vs="previous", width=1000)
    assert "~" in next(line for line in text.splitlines() if line.startswith("main"))
    table = compare(["gpt_train"], uri, width=1000)
    assert "(3 seeds)" in table and " seeds " in table.splitlines()[1] + " "


def test_smoke_dag_trains_seed_groups_end_to_end(smoke_dag):
    """gpt_train (2 seeds) and mcq_finetune's finetuned_context (2 seeds): each seed its own MLflow run
    nested under the cell's run, the cell's metrics.json holds mean, sd and interval, the per-seed
    table lies beside it, and the report shows 'mean [low, high] (2 seeds)'."""
    runs = mlflow_runs(smoke_dag)
    groups = (("gpt_train", "main", "val_loss_final"), ("mcq_finetune", "finetuned_context", "test_map3"))
    for stage, cell, key in groups:
        folder = smoke_dag / "results" / stage / cell
        rec = json.loads((folder / "metrics.json").read_text())
        m = rec["metrics"]
        assert m["seeds"] == 2 and m[f"{key}_low"] <= m[key] <= m[f"{key}_high"], m
        per_seed = pd.read_csv(folder / "seeds.csv")
        assert list(per_seed["seed"]) == [1234, 1235]
        if key in per_seed:
            assert per_seed[key].mean() == pytest.approx(m[key])
        children = runs[runs["tags.mlflow.parentRunId"] == rec["run_id"]]
        assert sorted(children["tags.seed"].astype(int)) == [1234, 1235], children
        assert set(children["status"]) == {"FINISHED"}
        assert rec["info"]["seeds"] == "1234, 1235"
    index = (smoke_dag / "results" / "reports" / "index.md").read_text()
    assert "(2 seeds)" in index
