"""The report and the MLflow UI on a real smoke DAG; profiles plan the DAG offline."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request

import pandas as pd
import pytest

from steps.ui_app import DEFAULT_SCRIPT
from tests.conftest import ROOT, clean_env, smoke_cells, snakemake

pytestmark = pytest.mark.slow


def test_report_numbers_equal_mlflow_metrics(smoke_dag):
    from steps.core.stage import load
    from steps.tracking import store

    client = store.client(f"sqlite:///{smoke_dag / 'results/mlflow.db'}")
    checked = 0
    for stage in smoke_cells():
        table = pd.read_csv(smoke_dag / "results/reports" / f"{stage}.csv", keep_default_na=False)
        columns = load(stage).columns
        for _, row in table[table["status"] == "ok"].iterrows():
            metrics = client.get_run(row["run_id"]).data.metrics
            for title, ref in columns.items():
                kind, _, key = ref.partition(".")
                if kind == "metrics" and key in metrics and row[title] != "":
                    assert float(row[title]) == pytest.approx(metrics[key], rel=1e-12), (stage, title)
                    checked += 1
    assert checked >= 5
    html = (smoke_dag / "results/reports/index.html").read_text()
    assert "<table>" in html and "/#/experiments/" in html and "?workflowType=machine_learning" in html
    assert "## Headline" in (smoke_dag / "results/reports/index.md").read_text()


def test_narrowed_matrix_narrows_tables(smoke_dag, tmp_path):
    stage, stage_cells = next((s, c) for s, c in smoke_cells().items() if len(c) >= 2)
    work = tmp_path / "copy"
    shutil.copytree(smoke_dag, work, symlinks=True)
    snakemake(work, "--config", f"{stage}={json.dumps({'select': stage_cells[:1]})}")
    table = pd.read_csv(work / "results/reports" / f"{stage}.csv")
    assert list(table["cell"]) == stage_cells[:1]


def _get(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode() if body else None, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_ui_server_serves_every_run_with_tags(smoke_dag):
    from steps.ui import free_port

    port = free_port()
    proc = subprocess.Popen(
        [*map(str, [__import__("sys").executable, "-m", "steps.ui", "--port", port])],
        cwd=smoke_dag,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.5)
        with urllib.request.urlopen(f"{base}/", timeout=10) as r:
            page = r.read().decode()
        assert page.index(DEFAULT_SCRIPT) < page.index("static/js/main.")  # set before the UI's bundle runs
        exps = _get(f"{base}/api/2.0/mlflow/experiments/search", {"max_results": 1000})["experiments"]
        names = {e["name"] for e in exps}
        ids = [e["experiment_id"] for e in exps]
        runs = _get(f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": ids, "max_results": 1000})["runs"]
        by_id = {r["info"]["run_id"]: r for r in runs}
        for stage, stage_cells in smoke_cells().items():
            assert f"n00bgpt/{stage}" in names
            for cell in stage_cells:
                rec = json.loads((smoke_dag / "results" / stage / cell / "metrics.json").read_text())
                tags = {t["key"]: t["value"] for t in by_id[rec["run_id"]]["data"]["tags"]}
                assert tags["rule"] == stage and tags["cell"] == cell and tags["config_hash"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def job_stats(out: str) -> dict[str, int]:
    """Snakemake's "Job stats" table (job, count) from a dry run's output."""
    block = out.split("Job stats:", 1)[1].split("total", 1)[0]
    rows = [line.split() for line in block.splitlines()[3:] if line.strip()]
    return {name: int(count) for name, count in rows}


@pytest.mark.parametrize("profile", ["slurm", "slurm-local", "workstation"])
def test_profiles_plan_the_dag(tmp_path, profile):
    """Each profile plans every declared cell of every stage once, the report and `all` once."""
    from steps.config import cells, load_config

    files = [ROOT / "configs/default.yaml", ROOT / "configs/smoke.yaml"]
    extra = []
    if profile == "workstation":  # one --configfile flag: a second one replaces the first (argparse)
        files.append(ROOT / "configs/gpu.yaml")
        extra = ["--configfile", *map(str, files[1:])]
    proc = snakemake(tmp_path, "-n", "--profile", str(ROOT / "workflow/profiles" / profile), *extra)
    out = proc.stdout + proc.stderr
    assert "This was a dry-run" in out
    cfg = load_config(*files)
    expected = {s: len(cells(cfg, s)) for s in smoke_cells()}
    assert job_stats(out) == {**expected, "report": 1, "all": 1}


def test_snakemake_report_includes_the_lab_report(smoke_dag, tmp_path):
    target = tmp_path / "report.html"
    snakemake(smoke_dag, "--report", str(target))
    assert target.exists() and target.stat().st_size > 10_000


def test_report_values_compare_all_but_timings(tmp_path):
    from steps.report.values import differences, main, report_values

    for side, (loss, rate) in {"a": ("2.5", "100"), "b": ("2.5", "250"), "c": ("2.6", "100")}.items():
        (tmp_path / side / "reports").mkdir(parents=True)
        (tmp_path / side / "reports" / "perf.csv").write_text(f"cell,loss,tokens/s\nbase,{loss},{rate}\n")
    a, b, c = (report_values(tmp_path / s) for s in "abc")
    assert a == {("perf", "base", "loss"): "2.5"} and not differences(a, b)
    assert differences(a, c) == {("perf", "base", "loss"): ("2.5", "2.6")}
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert main([str(tmp_path / "a"), str(tmp_path / "c")]) == 1
    assert main([str(tmp_path / "a"), str(tmp_path / "missing")]) == 2


def test_report_values_mask_a_ratio_quoted_in_text_but_not_the_words(tmp_path):
    from steps.report.values import differences, report_values

    notes = {
        "a": "jit 193× [180, 201] eager's speed; compiled 1× for 3 calls",
        "b": "jit 107× [99, 1.2e+02] eager's speed; compiled 1× for 3 calls",
        "c": "jit 193× [180, 201] eager's speed; compiled 3× for 3 calls",
    }
    for side, text in notes.items():
        (tmp_path / side / "reports").mkdir(parents=True)
        (tmp_path / side / "reports" / "sharding.csv").write_text(f'cell,notes\njax_lessons,"{text}"\n')
    a, b, c = (report_values(tmp_path / s) for s in "abc")
    assert a[("sharding", "jax_lessons", "notes")] == "jit (timed) eager's speed; compiled 1× for 3 calls"
    assert not differences(a, b)
    assert list(differences(a, c)) == [("sharding", "jax_lessons", "notes")]


def test_report_values_leave_out_a_stages_measured_columns_and_keep_its_predicted_ones(tmp_path):
    """The inference stage's timed speed-up differs run to run (a cluster run against a local one,
    tests/test_slurm.py); its predicted latency comes from a formula and must not."""
    from steps.core.stage import Presentation
    from steps.report.values import differences, report_values

    cols = "cell,cache speed-up,predicted decode ms/token"
    for side, row in {"a": "x,1.29,8.13", "b": "x,1.37,8.13", "c": "x,1.29,8.2"}.items():
        (tmp_path / side / "reports").mkdir(parents=True)
        (tmp_path / side / "reports" / "inference.csv").write_text(f"{cols}\n{row}\n")
    a, b, c = (report_values(tmp_path / s) for s in "abc")
    assert a == {("inference", "x", "predicted decode ms/token"): "8.13"} and not differences(a, b)
    assert differences(a, c) == {("inference", "x", "predicted decode ms/token"): ("8.13", "8.2")}
    with pytest.raises(ValueError, match="measured column 'speed' is not a column"):
        Presentation(columns={"speed-up": "metrics.s"}, measured=["speed"])
