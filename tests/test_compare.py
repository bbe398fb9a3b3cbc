"""`python -m steps.compare`: the lab's runs side by side in the terminal, read from a real MLflow
store: runs written by the jobs' own MlflowRun on a temporary SQLite store, and the smoke DAG's."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from steps.compare import CompareError, compare, main
from steps.tracking.mlflow_run import MlflowRun
from tests.conftest import clean_env, smoke_cells

COMMON = {"seed": 0, "device": "cpu"}


def job(uri: str, stage: str, cell: str, params: dict, metrics: dict, status: str = "ok") -> str:
    """One run as a job writes it (tags, flattened params, metrics, status)."""
    run = MlflowRun(uri, stage, cell, "hash", 0)
    run.start(params, COMMON)
    run.log_metrics(metrics)
    run.end(status)
    time.sleep(0.01)  # distinct start times: "latest" is well defined
    return run.run_id


@pytest.fixture
def store(tmp_path, monkeypatch):
    """perf: baseline run twice (the second is the latest), tf32 once, and a run nested under the
    tf32 job (as word2vec's seeds are) that is no job of its own; gpt_train: one cell."""
    monkeypatch.chdir(tmp_path)  # the experiments' artifacts go under ./results
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    base = {"batch_size": 8, "model": {"n_embd": 64}, "tf32": False}
    job(uri, "perf", "baseline", base, {"tokens_per_s": 100.0, "loss": 5.0})
    job(uri, "perf", "baseline", base, {"tokens_per_s": 111.0, "loss": 5.0})
    tf32 = job(uri, "perf", "tf32", {**base, "tf32": True}, {"tokens_per_s": 222.0, "loss": 5.0}, status="skipped")
    child = MlflowRun(uri, "perf", "tf32", "hash", 1)
    child.start({**base, "tf32": "child"}, COMMON)
    child.set_tag("mlflow.parentRunId", tf32)
    child.end("ok")
    job(uri, "gpt_train", "main", {"lr": 1e-3}, {"val_loss_final": 3.25})
    return uri


def rows(block: str) -> list[list[str]]:
    """The table's rows, split on blanks (one table block: the tests print wide)."""
    lines = block.strip().splitlines()[2:]
    end = next((i for i, line in enumerate(lines) if line.startswith("same in every row")), len(lines))
    return [line.split() for line in lines[:end] if line.strip()]


def test_latest_run_per_cell_params_that_differ_and_key_metrics(store):
    out = compare(["perf"], store, width=1000)
    assert out.splitlines()[0] == "== perf: 2 run(s), latest run per cell =="
    header = out.splitlines()[1].split()
    assert header[:4] == ["cell", "status", "start", "run"]
    assert "tf32" in header and "batch_size" not in header  # only the param that differs is a column
    assert "tokens/s" in header and "loss" in header  # perf's report columns (Stage.columns), by title
    body = rows(out)
    assert [r[0] for r in body] == ["baseline", "tf32"]
    assert body[0][1] == "ok" and body[1][1] == "skipped"
    assert "111" in body[0] and "100" not in body[0] and "False" in body[0]
    assert "222" in body[1] and "True" in body[1] and "child" not in out
    footer = out[out.index("same in every row") :]
    assert "batch_size=8" in footer and "model.n_embd=64" in footer and "common.seed=0" in footer


def test_all_runs_diff_and_chosen_metrics(store):
    out = compare(["perf"], store, latest=False, diff=True, metrics=["tokens_per_s", "metrics.loss"], width=1000)
    header = out.splitlines()[1].split()
    assert "tokens_per_s" in header and "loss" not in header  # --diff drops the metric equal in every row
    assert [r[0] for r in rows(out)] == ["baseline", "baseline", "tf32"]
    assert "same in every row" not in out
    both = compare(None, store, width=1000)  # every stage in the store, in creation order
    assert both.index("== perf:") < both.index("== gpt_train: 1 run(s)") and "3.25" in both


def test_clear_errors(store, tmp_path, capsys):
    with pytest.raises(CompareError, match=r"unknown stage word2vec: .* has runs of perf, gpt_train"):
        compare(["word2vec"], store)
    missing = tmp_path / "none" / "mlflow.db"
    with pytest.raises(SystemExit, match=r"no MLflow store at .*none/mlflow.db: run the DAG first .*snakemake"):
        main(["--tracking-uri", f"sqlite:///{missing}"])
    assert not missing.exists()  # no empty database left behind


def test_compare_on_the_smoke_store(smoke_dag):
    """The CLI on the smoke DAG's store: every smoke cell under its stage, and what differs."""
    uri = f"sqlite:///{smoke_dag / 'results' / 'mlflow.db'}"

    def cli(*args: str) -> str:
        cmd = [sys.executable, "-m", "steps.compare", "--tracking-uri", uri, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**clean_env(), "COLUMNS": "1000"}, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    out = cli()
    blocks = {b.split(":")[0]: b for b in re.split(r"^== ", out, flags=re.M)[1:]}
    for stage, cells in smoke_cells().items():
        assert stage in blocks, f"{stage} missing from:\n{out}"
        assert sorted(r[0] for r in rows(blocks[stage])) == sorted(cells), blocks[stage]
    perf = cli("--stage", "perf", "--diff")
    header = perf.splitlines()[1].split()
    assert {"tf32", "amp", "desc"} <= set(header) and "batch_size" not in header
    by_cell = {r[0]: r for r in rows(perf)}
    assert "bf16" in by_cell["amp_bf16"] and "True" in by_cell["tf32"]
    w2v = blocks["word2vec"]
    assert "backend" in w2v.splitlines()[1].split() and "gensim" in w2v


def test_side_by_side_ratio_shows_with_its_interval_and_verdict():
    """A ratio with `_low`/`_high` metrics prints as one column "v [low, high] verdict" (faster:
    the interval lies above 1, slower: below, ~: it holds 1), and its low/high columns go."""
    import pandas as pd

    from steps.compare import ID_COLUMNS, build_table

    runs = pd.DataFrame(
        {
            **{c: ["a", "b", "c", "d"] for c in ID_COLUMNS},
            "metrics.speedup": [2.0, 0.5, 1.02, float("nan")],
            "metrics.speedup_low": [1.5, 0.4, 0.9, float("nan")],
            "metrics.speedup_high": [2.5, 0.6, 1.1, float("nan")],
            "metrics.loss": [1.0, 2.0, 3.0, 4.0],
        }
    )
    cols = {"× baseline": "metrics.speedup", "low": "metrics.speedup_low", "high": "metrics.speedup_high"}
    table, _ = build_table(runs, {**cols, "loss": "metrics.loss"})
    assert list(table.columns) == [*ID_COLUMNS, "× baseline", "loss"]
    assert (
        table["× baseline"].tolist()[:3] == ["2 [1.5, 2.5] faster", "0.5 [0.4, 0.6] slower", "1.02 [0.9, 1.1] ~"]
        and table["× baseline"].isna().iloc[3]
    )
