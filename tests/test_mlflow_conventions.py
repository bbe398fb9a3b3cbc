"""The MLflow store as MLflow's users read it, checked through the REST API of a real `mlflow
server` (temporary SQLite database, free port) that a real Snakemake run of part of the smoke DAG
logs to: experiment kind and description, source tags, run names and notes, datasets with digests,
the lab run of the invocation with every job nested under it, word2vec seeds as child runs of
their cell; and a failed DAG that prints the failed job's error last and ends its lab run FAILED."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from steps.tracking.describe import EXPERIMENT_KIND, module_summary
from steps.ui import free_port
from tests.conftest import ROOT, clean_env, run_stage, snakemake, stage_params

pytestmark = pytest.mark.slow
UNTIL = ("word2vec", "train_tokenizer", "prepare_mcq")  # + prepare_corpus, their input
STAGES = ("prepare_corpus", "prepare_mcq", "train_tokenizer", "word2vec")
W2V_CELLS = f"word2vec={json.dumps({'select': ['sgd', 'gensim']})}"  # the two cells the tests read


def api(base: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        f"{base}/api/2.0/mlflow/{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def tags(obj: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in obj.get("tags") or obj.get("data", {}).get("tags", [])}


def all_runs(base: str) -> list[dict]:
    ids = [e["experiment_id"] for e in api(base, "experiments/search", {"max_results": 1000})["experiments"]]
    return api(base, "runs/search", {"experiment_ids": ids, "max_results": 1000}).get("runs", [])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"]
    cmd += ["--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--workers", "1"], env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.5)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def tracking(base: str) -> str:
    """A `--config` item (one --config flag: a second one would replace the first)."""
    return f"tracking={json.dumps({'uri': base})}"


@pytest.fixture(scope="module")
def dag(server, tmp_path_factory) -> Path:
    """Part of the smoke DAG (corpus, tokenizer, MCQ splits, two word2vec cells: ours and gensim)
    logging to the server."""
    work = tmp_path_factory.mktemp("dag")
    snakemake(work, "--config", tracking(server), W2V_CELLS, "--until", *UNTIL)
    return work


def record(work: Path, stage: str, cell: str) -> dict:
    return json.loads((work / "results" / stage / cell / "metrics.json").read_text())


def job_records(work: Path) -> dict[tuple[str, str], dict]:
    return {(p.parts[-3], p.parts[-2]): json.loads(p.read_text()) for p in (work / "results").glob("*/*/metrics.json")}


def test_experiments_are_model_training_and_described(server, dag):
    exps = {e["name"]: e for e in api(server, "experiments/search", {"max_results": 1000})["experiments"]}
    for stage in (*STAGES, "lab"):
        t = tags(exps[f"n00bgpt/{stage}"])
        assert t["mlflow.experimentKind"] == EXPERIMENT_KIND
        if stage != "lab":
            assert t["mlflow.note.content"].startswith(module_summary(f"steps.{stage}")[:60])
            assert f"results/reports/{stage}.md" in t["mlflow.note.content"]
        else:
            assert "nested under this one" in t["mlflow.note.content"]


def test_job_runs_carry_mlflow_source_tags_and_notes(server, dag):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    recs = job_records(dag)
    assert {s for s, _ in recs} == set(STAGES)
    for (stage, cell), rec in recs.items():
        run = api(server, f"runs/get?run_id={rec['run_id']}")["run"]
        t = tags(run)
        name = f"{stage}:{cell}" + (" (skipped)" if rec["status"] == "skipped" else "")
        assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == name
        assert t["mlflow.runName"] == name
        assert t["mlflow.source.name"] == f"steps.{stage}" and t["mlflow.source.type"] == "JOB"
        assert t["mlflow.source.git.commit"] == head
        assert t["mlflow.note.content"].startswith(f"Cell `{cell}` of stage `{stage}`")
    # the note names the cell's own overrides (configs/default.yaml: word2vec.cells.sgd)
    sgd = tags(api(server, f"runs/get?run_id={recs['word2vec', 'sgd']['run_id']}")["run"])
    assert '| `optimizer` | `"sgd"` |' in sgd["mlflow.note.content"]


def inputs_of(base: str, run_id: str) -> dict[str, dict]:
    run = api(base, f"runs/get?run_id={run_id}")["run"]
    return {tags(d)["mlflow.data.context"]: d["dataset"] for d in run.get("inputs", {}).get("dataset_inputs", [])}


def test_corpus_datasets_with_digests(server, dag):
    import datasets

    corpus = datasets.load_from_disk(str(dag / "results/data/corpus"))
    seen = []
    for stage, cell in (("train_tokenizer", "main"), ("word2vec", "sgd"), ("word2vec", "gensim")):
        ds = inputs_of(server, record(dag, stage, cell)["run_id"])
        assert set(ds) == {"train", "validation"}, (stage, ds)
        for split, d in ds.items():
            assert d["name"] == "corpus" and len(d["digest"]) == 12
            assert json.loads(d["profile"])["num_rows"] == corpus[split].num_rows
            assert json.loads(d["schema"])["mlflow_colspec"][0]["name"] == "text"
        seen.append((ds["train"]["digest"], ds["validation"]["digest"]))
    assert len(set(seen)) == 1 and seen[0][0] != seen[0][1]  # same bytes, same digest; splits differ
    assert inputs_of(server, record(dag, "prepare_corpus", "main")["run_id"]) == {}  # no DAG input


def test_an_empty_optional_input_is_no_dataset(tmp_path, monkeypatch):
    """gpt_train's `base` input is `[]` unless a cell fine-tunes (init_from): it reaches the job as "",
    which Path() reads as the working directory; it names no dataset (CI caught `{"uri": "<workdir>"}`)."""
    from steps.tracking.datasets import dataset_inputs, is_dataset_input

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.csv").write_text("a\n1\n")
    assert not is_dataset_input("") and not is_dataset_input(" ")
    assert [d.dataset.name for d in dataset_inputs({"base": "", "data": str(tmp_path / "data.csv")})] == ["data.csv"]


def test_tokenizer_and_mcq_splits_as_datasets(server, dag, tmp_path):
    """A job given the DAG's tokenizer and MCQ folders as inputs logs one dataset per MCQ split and
    the tokenizer as one; a changed byte changes a digest."""
    import shutil

    for name in ("tokenizer", "mcq"):
        shutil.copytree(dag / "results/data" / name, tmp_path / name)
    params = stage_params(
        "prepare_corpus", source="builtin:shakespeare", unit="scene", val_fraction=0.2, max_documents=5, min_chars=1
    )
    inputs = {"tokenizer": str(tmp_path / "tokenizer"), "data": str(tmp_path / "mcq")}
    common = {"tracking": {"uri": server}}
    run_stage(tmp_path, "prepare_corpus", params, common=common, inputs=inputs)
    first = inputs_of(server, json.loads((tmp_path / "results/prepare_corpus/main/metrics.json").read_text())["run_id"])
    assert set(first) == {"tokenizer", "train", "validation", "test"}
    assert first["tokenizer"]["name"] == "tokenizer" and {first[s]["name"] for s in ("train", "test")} == {"mcq"}
    rows = sum(1 for _ in open(tmp_path / "mcq/train.csv")) - 1
    assert json.loads(first["train"]["profile"])["num_rows"] <= rows  # CSV rows may hold newlines
    with open(tmp_path / "mcq/test.csv", "a") as fh:
        fh.write("\n")
    run_stage(tmp_path, "prepare_corpus", params, common=common, inputs=inputs)
    again = inputs_of(server, json.loads((tmp_path / "results/prepare_corpus/main/metrics.json").read_text())["run_id"])
    assert again["test"]["digest"] != first["test"]["digest"]
    assert again["train"]["digest"] == first["train"]["digest"]
    assert again["tokenizer"]["digest"] == first["tokenizer"]["digest"]


def test_one_lab_run_with_every_job_nested(server, dag):
    runs = all_runs(server)
    workdir = str(dag.resolve())
    labs = [r for r in runs if tags(r).get("workdir") == workdir]
    assert len(labs) == 1
    lab = labs[0]
    assert lab["info"]["status"] == "FINISHED" and lab["info"]["run_name"].startswith("lab run ")
    recs = job_records(dag)
    children = {r["info"]["run_id"] for r in runs if tags(r).get("mlflow.parentRunId") == lab["info"]["run_id"]}
    assert children == {rec["run_id"] for rec in recs.values()}
    metrics = {m["key"]: m["value"] for m in lab["data"]["metrics"]}
    assert metrics["jobs_ok"] == len(recs) and metrics["jobs_failed"] == 0
    note = tags(lab)["mlflow.note.content"]
    assert f"({len(recs)} ok, 0 failed, 0 killed, 0 skipped)" in note and "/artifacts/jobs.md" in note
    from mlflow.tracking import MlflowClient

    table = Path(MlflowClient(server).download_artifacts(lab["info"]["run_id"], "jobs.md", str(dag))).read_text()
    assert all(f"/runs/{rec['run_id']}?workflowType=machine_learning" in table for rec in recs.values())


def test_word2vec_seeds_are_child_runs_of_their_cell(server, dag):
    import pandas as pd

    runs = all_runs(server)
    for cell in ("sgd", "gensim"):
        rec = record(dag, "word2vec", cell)
        seeds = [r for r in runs if tags(r).get("mlflow.parentRunId") == rec["run_id"]]
        table = pd.read_csv(dag / f"results/word2vec/{cell}/seeds.csv")
        assert len(seeds) == rec["metrics"]["seeds"] == len(table) >= 2
        acc = {int(tags(r)["seed"]): {m["key"]: m["value"] for m in r["data"]["metrics"]}["analogy_acc"] for r in seeds}
        assert acc == pytest.approx(dict(zip(table["seed"], table["analogy_acc"])), abs=1e-12)
        assert sum(acc.values()) / len(acc) == pytest.approx(rec["metrics"]["analogy_acc"], abs=1e-12)
        cell_run = api(server, f"runs/get?run_id={rec['run_id']}")["run"]
        assert not [m for m in cell_run["data"]["metrics"] if m["key"].startswith("seed_")]


def test_failed_job_error_is_printed_last_and_lab_run_fails(server, tmp_path):
    bad = {"source": str(tmp_path / "nowhere" / "*.txt")}
    proc = snakemake(
        tmp_path,
        "--config",
        tracking(server),
        f"prepare_corpus={json.dumps(bad)}",
        "--until",
        "prepare_corpus",
        check=False,
    )
    assert proc.returncode != 0
    tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
    assert "prepare_corpus[main] failed: InputError: prepare_corpus.source" in tail, tail
    assert "matches no files" in tail and "results/logs/prepare_corpus/main.log" in tail
    lab = [r for r in all_runs(server) if tags(r).get("workdir") == str(tmp_path.resolve())]
    assert [r["info"]["status"] for r in lab] == ["FAILED"]
    assert {m["key"]: m["value"] for m in lab[0]["data"]["metrics"]}["jobs_failed"] == 1
