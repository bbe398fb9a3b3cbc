"""`python -m steps.compare`: the lab's runs side by side in the terminal, read from a real MLflow
store: runs written by the jobs' own MlflowRun on a temporary SQLite store, and the smoke DAG's."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time

import pytest

from steps.compare import CompareError, compare, main
from steps.compare.read import read_sqlite, read_with_client
from steps.compare.table import leaves
from steps.presentation import STAGE_ORDER
from steps.tracking import store as tracking_store
from steps.tracking.mlflow_run import MlflowRun
from tests.conftest import ROOT, clean_env, run_module, smoke_cells, stage_rules

COMMON = {"seed": 0, "device": "cpu"}
WIDE = {"width": 1000}


def job(uri: str, stage: str, cell: str, params: dict, metrics: dict, status: str = "ok") -> str:
    """One run as a job writes it (tags, flattened params, metrics, status)."""
    run = MlflowRun(uri, stage, cell, "hash", 0)
    run.start(params, COMMON)
    run.log_metrics(metrics)
    run.end(status)
    time.sleep(0.01)  # distinct start times: "latest" is well defined
    return run.run_id


def ratio(v: float, lo: float, hi: float) -> dict:
    """perf's side-by-side speedup with its 95 % interval (steps/paired.py's metric names)."""
    return {"speedup": v, "speedup_low": lo, "speedup_high": hi}


BASE = {"batch_size": 8, "model": {"n_embd": 64}, "tf32": False, "plans": [{"name": "a", "tp": 1}]}


@pytest.fixture
def store(tmp_path, monkeypatch):
    """perf (created first): baseline run twice (the second is the latest), tf32 once, and a run
    nested under the tf32 job (as word2vec's seeds are) that is no job of its own; gpt_train: one
    cell; `mystery`: a stage with no presentation module (renamed since, say)."""
    monkeypatch.chdir(tmp_path)  # the experiments' artifacts go under ./results
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job(uri, "perf", "baseline", BASE, {"tokens_per_s": 100.0, "loss": 5.0, **ratio(1.0, 1.0, 1.0)})
    job(uri, "perf", "baseline", BASE, {"tokens_per_s": 111.0, "loss": 5.0, **ratio(1.0, 1.0, 1.0)})
    tf32 = {**BASE, "tf32": True, "plans": [{"name": "a", "tp": 2}]}
    t = job(uri, "perf", "tf32", tf32, {"tokens_per_s": 222.0, "loss": 5.0, **ratio(2.0, 1.8, 2.2)}, status="skipped")
    child = MlflowRun(uri, "perf", "tf32", "hash", 1)
    child.start({**BASE, "tf32": "child"}, COMMON)
    child.set_tag("mlflow.parentRunId", t)
    child.end("ok")
    job(uri, "gpt_train", "main", {"lr": 1e-3}, {"val_loss_final": 3.25})
    job(uri, "mystery", "main", {"x": 1}, {"odd_metric": 7.0})
    return uri


def rows(block: str) -> list[list[str]]:
    """The table's rows, split on blanks (a block: title line, header, rows, notes)."""
    lines = block.strip().splitlines()[2:]
    return [line.split() for line in lines if line.strip() and not re.match(r"^\d+ (param|more)", line)]


def blocks(out: str) -> dict[str, str]:
    return {b.split(":")[0]: b for b in re.split(r"^== ", out, flags=re.M)[1:]}


def test_latest_run_per_cell_headline_metrics_and_changed_leaves(store):
    out = compare(["perf"], store, **WIDE)
    assert out.splitlines()[0] == "== perf: 2 run(s), latest run per cell =="
    header = out.splitlines()[1].split("  ")
    header = [h.strip() for h in header if h.strip()]
    assert header[:3] == ["cell", "status", "× baseline"]  # the headline first (steps/presentation/perf.py)
    assert {"tokens/s", "loss", "tf32", "plans[a].tp"} <= set(header)  # nested list param: its changed leaf
    assert "batch_size" not in header and "model.n_embd" not in header and "plans[a].name" not in header
    assert "low" not in header and "high" not in header  # the interval goes into its ratio's column
    body = rows(out)
    assert [r[0] for r in body] == ["baseline", "tf32"]
    assert body[0][1] == "ok" and body[1][1] == "skipped"
    assert "111" in body[0] and "100" not in body[0] and "False" in body[0]
    assert "222" in body[1] and "True" in body[1] and "child" not in out
    assert "2 [1.8, 2.2] faster" in out and "1 [1, 1] ~" in out
    assert re.search(r"^5 param\(s\) equal in every row; runs: /#/experiments/\d+/runs", out, re.M)


def test_stages_in_dag_order_and_no_import_error(store):
    out = compare(None, store, **WIDE)
    assert out.index("== gpt_train:") < out.index("== perf:") < out.index("== mystery:")  # not creation order
    assert "No module" not in out and "presentation" not in out
    assert "odd_metric" in blocks(out)["mystery"] and "7" in blocks(out)["mystery"]  # every metric it logged


def test_dag_order_is_the_workflows():
    """STAGE_ORDER is the order of the stage rules as Snakemake parses the workflow."""
    assert list(stage_rules()) == list(STAGE_ORDER)


def test_all_runs_only_changed_sort_and_chosen_metrics(store):
    out = compare(["perf"], store, latest=False, only_changed=True, metrics=["tokens_per_s", "metrics.loss"], **WIDE)
    header = out.splitlines()[1].split()
    assert "tokens_per_s" in header and "loss" not in header  # equal in every row: hidden
    assert [r[0] for r in rows(out)] == ["baseline", "baseline", "tf32"]
    ranked = compare(["perf"], store, latest=False, sort="tokens/s", descending=True, **WIDE)
    assert [r[0] for r in rows(ranked)] == ["tf32", "baseline", "baseline"]
    assert [r[0] for r in rows(compare(["perf"], store, sort="speedup", **WIDE))] == ["baseline", "tf32"]
    with pytest.raises(CompareError, match=r"--sort nope: no such metric or param in perf"):
        compare(["perf"], store, sort="nope")


def test_formats(store):
    table = list(csv.DictReader(io.StringIO(compare(None, store, fmt="csv"))))
    assert [(r["stage"], r["cell"]) for r in table] == [
        ("gpt_train", "main"),
        ("perf", "baseline"),
        ("perf", "tf32"),
        ("mystery", "main"),
    ]
    tf32 = table[2]
    assert tf32["× baseline"] == "2.0" and tf32["low"] == "1.8" and tf32["high"] == "2.2"  # numbers, not text
    assert re.fullmatch(
        rf"/#/experiments/\d+/runs/{tf32['run']}[0-9a-f]{{24}}\?workflowType=machine_learning", tf32["link"]
    )
    data = json.loads(compare(["perf"], store, fmt="json", ui="http://host:1234"))
    perf = data["stages"]["perf"]
    assert perf[1]["tokens/s"] == 222.0 and perf[1]["plans[a].tp"] == "2" and perf[0]["× baseline"] == 1.0
    assert perf[1]["link"].startswith("http://host:1234/#/experiments/")
    md = compare(["perf"], store, fmt="markdown")
    lines = md.splitlines()
    assert lines[0] == "## perf: 2 run(s), latest run per cell" and lines[2].startswith("| cell | status | × baseline")
    assert lines[3].startswith("|---|---|---:|---:|")  # text left, numbers (with an interval too) right
    assert re.search(r"\[[0-9a-f]{8}\]\(/#/experiments/\d+/runs/[0-9a-f]{32}\?workflowType", md)


def test_sql_reader_equals_mlflow_client(store):
    """The fast reader (SQL on the SQLite file) gives what MLflow's own client gives."""
    from pathlib import Path

    fast = read_sqlite(store, Path(store.removeprefix("sqlite:///")))
    slow = read_with_client(store)
    assert fast.experiments == slow.experiments
    assert fast.runs == slow.runs and len(fast.runs) == 6


def test_leaves():
    assert leaves("plans", '[{"name": "a", "mesh": {"tp": 2}}, {"name": "b"}]') == {
        "plans[a].name": "a",
        "plans[a].mesh.tp": "2",
        "plans[b].name": "b",
    }
    assert leaves("sizes", "[1, 2]") == {"sizes": "[1, 2]"}  # a list of scalars is one value
    assert leaves("cut", '[{"a": 1}, {"b"') == {"cut": '[{"a": 1}, {"b"'}  # cut at MLflow's limit: as is
    assert leaves("xs", '[{"a": true}, {"a": null}]') == {"xs[0].a": "True", "xs[1].a": "None"}


def test_clear_errors(store, tmp_path):
    with pytest.raises(CompareError, match=r"unknown stage word2vec: .* has runs of perf, gpt_train, mystery"):
        compare(["word2vec"], store)
    with pytest.raises(CompareError, match=r"no lab run"):
        compare(None, store, vs="previous")
    missing = tmp_path / "none" / "mlflow.db"
    with pytest.raises(SystemExit, match=r"no MLflow store at .*none/mlflow.db: run the DAG first .*snakemake"):
        main(["--tracking-uri", f"sqlite:///{missing}"])
    assert not missing.exists()  # no empty database left behind


def lab_run(client, exp: str) -> tuple[str, callable]:
    """A lab run as `snakemake` opens it (steps/tracking/lab.py) and the function that ends it."""
    run = client.create_run(exp, run_name="lab run")
    time.sleep(0.01)
    return run.info.run_id, lambda: (time.sleep(0.01), client.set_terminated(run.info.run_id, "FINISHED"))


def test_vs_previous_lab_run(store, monkeypatch):
    """Two lab runs: the second reruns tf32 (its interval now above the first's: beyond noise), reruns
    the baseline within noise, and adds a cell; gpt_train stays as it was (same run)."""
    client = tracking_store.client(store)
    lab = tracking_store.experiment_id(client, "lab", store)
    first, end_first = lab_run(client, lab)
    job(store, "perf", "tf32", {**BASE, "tf32": True}, {"tokens_per_s": 220.0, **ratio(2.0, 1.8, 2.2)})
    end_first()
    second, end_second = lab_run(client, lab)
    job(
        store, "perf", "tf32", {**BASE, "tf32": True, "batch_size": 16}, {"tokens_per_s": 330.0, **ratio(3.0, 2.7, 3.3)}
    )
    job(store, "perf", "baseline", BASE, {"tokens_per_s": 115.0, **ratio(1.02, 0.95, 1.1)})
    job(store, "perf", "amp", BASE, {"tokens_per_s": 150.0, **ratio(1.5, 1.4, 1.6)})
    end_second()
    out = compare(None, store, vs="previous", **WIDE)
    assert out.splitlines()[0].startswith(f"lab run {second[:8]} (") and f"vs {first[:8]} (" in out.splitlines()[0]
    perf = blocks(out)["perf"]
    assert perf.startswith("perf: 3 of 3 cell(s) rerun since")
    by_cell = {r[0]: " ".join(r) for r in rows(perf)}
    assert "rerun" in by_cell["tf32"] and "3 (+50.0%) ↑" in by_cell["tf32"] and "330 (+50.0%)" in by_cell["tf32"]
    assert "batch_size: 8→16" in by_cell["tf32"]
    assert "1.02 (+2.0%) ~" in by_cell["baseline"] and "115 (+3.6%)" in by_cell["baseline"]
    assert "new" in by_cell["amp"]
    assert "gpt_train" not in blocks(out) and "no change in 2 stage(s): gpt_train, mystery" in out
    assert "same" in rows(blocks(compare(None, store, vs="previous", latest=False, **WIDE))["gpt_train"])[0]
    data = json.loads(compare(["perf"], store, vs="previous", fmt="json"))
    assert (data["lab_run"], data["vs"]) == (second, first)
    tf32 = next(r for r in data["stages"]["perf"] if r["cell"] == "tf32")
    assert tf32["× baseline noise"] == "up" and tf32["× baseline change"] == pytest.approx(1.0)
    assert tf32["tokens/s before"] == 220.0
    against_id = compare(["perf"], store, vs=first[:10], fmt="json")
    assert json.loads(against_id) == data
    with pytest.raises(CompareError, match=r"no lab run before"):
        compare(None, store, vs="previous", lab=first)


def cli(uri: str, *args: str) -> subprocess.CompletedProcess:
    return run_module(ROOT, "steps.compare", ["--tracking-uri", uri, *args], env_extra={"COLUMNS": "120"})


def test_help_shows_defaults():
    proc = run_module(ROOT, "steps.compare", ["--help"])
    assert proc.returncode == 0
    assert "(default: asc)" in proc.stdout and "(default: table)" in proc.stdout


def test_compare_on_the_smoke_store(smoke_dag):
    """The CLI on the smoke DAG's store: every stage in DAG order, one screen each (120 columns), every
    smoke cell, no import error; fast: neither MLflow nor torch is imported."""
    uri = f"sqlite:///{smoke_dag / 'results' / 'mlflow.db'}"
    proc = cli(uri)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    out = proc.stdout
    found = blocks(out)
    assert list(found) == [s for s in STAGE_ORDER if s in found]
    for stage, cells in smoke_cells().items():
        assert stage in found, f"{stage} missing from:\n{out}"
        assert sorted(r[0] for r in rows(found[stage])) == sorted(cells), found[stage]
    assert max(map(len, out.splitlines())) <= 120
    assert "No module" not in out and "Traceback" not in out
    perf = cli(uri, "--stage", "perf", "--only-changed", "--format", "csv").stdout
    table = list(csv.DictReader(io.StringIO(perf)))
    assert {"tf32", "amp"} <= set(table[0]) and "batch_size" not in table[0]
    by_cell = {r["cell"]: r for r in table}
    assert by_cell["amp_bf16"]["amp"] == "bf16" and by_cell["tf32"]["tf32"] == "True"
    code = (
        "import sys, resource\nfrom steps.compare import main\n"
        f"main(['--tracking-uri', {uri!r}, '--format', 'json'])\n"
        "heavy = sorted(m for m in ('mlflow', 'torch', 'jax') if m in sys.modules)\n"
        "r = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(heavy, r.ru_utime + r.ru_stime, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=600)
    heavy, cpu = proc.stderr.strip().rsplit(" ", 1)
    assert heavy == "[]" and float(cpu) < 3.0, proc.stderr


def test_vs_shows_what_changed_first_and_why_before_the_numbers(store):
    """`--vs previous` on a 120-column terminal: only the stages and cells that changed (the rest named
    in one line; `--all`: everything), the changed cells first in a stated order, and why a cell reran
    (its changed params) before its numbers, so it is on screen."""
    client = tracking_store.client(store)
    lab = tracking_store.experiment_id(client, "lab", store)
    _, end_first = lab_run(client, lab)
    wide = {**BASE, "model": {"n_embd": 64, "n_layer": 12, "n_head": 12, "vocab_size": 50304}}
    job(store, "perf", "keep", wide, {"tokens_per_s": 90.0, "loss": 4.0, **ratio(0.9, 0.8, 1.0)})
    job(store, "perf", "tf32", wide, {"tokens_per_s": 220.0, "loss": 4.0, **ratio(2.0, 1.8, 2.2)})
    end_first()
    _, end_second = lab_run(client, lab)
    job(store, "perf", "amp", wide, {"tokens_per_s": 150.0, "loss": 4.0, **ratio(1.5, 1.4, 1.6)})
    job(store, "perf", "tf32", {**wide, "batch_size": 16}, {"tokens_per_s": 330.0, "loss": 4.0, **ratio(3, 2.7, 3.3)})
    end_second()

    out = compare(None, store, vs="previous")  # Options' width: 120
    lines = out.splitlines()
    assert max(map(len, lines)) <= 120 and len(lines) <= 12, out
    assert lines[1] == "rows: what changed first (rerun, new, gone), each kind by its run's start"
    assert "no change in 2 stage(s): gpt_train, mystery (--all shows every stage and cell)" in out
    assert list(blocks(out)) == ["perf"]
    perf = blocks(out)["perf"]
    assert perf.startswith("perf: 2 of 4 cell(s) rerun since") and "(2 unchanged not shown)" in perf
    header = perf.splitlines()[1]
    assert header.index("params changed") < header.index("× baseline")
    assert [r[:2] for r in rows(perf) if r[0] != "↑/↓:"] == [["tf32", "rerun"], ["amp", "new"]]
    assert "batch_size: 8→16" in perf.splitlines()[2]  # on screen, not cut off at the right edge

    everything = compare(None, store, vs="previous", latest=False)
    assert list(blocks(everything)) == ["perf", "gpt_train", "mystery"]  # a change first, then DAG order
    assert everything.splitlines()[1].endswith("run's start, then unchanged; stages with a change first")
    assert max(map(len, everything.splitlines())) <= 120
    moves = [r[1] for r in rows(blocks(everything)["perf"]) if r[0] != "↑/↓:"]
    assert moves == ["rerun", "new", "same", "same"]
    data = json.loads(compare(None, store, vs="previous", fmt="json"))  # machine formats: every stage and cell
    assert set(data["stages"]) == {"gpt_train", "perf", "mystery"} and len(data["stages"]["perf"]) == 4
    assert list(data["stages"]["perf"][0])[:4] == ["cell", "run", "status", "params changed"]
