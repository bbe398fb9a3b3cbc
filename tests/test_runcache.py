"""The run cache (steps/core/runcache.py; docs/pipeline.md, "Run cache"): a job run before comes back
restored, equal to what it computed; a corrupt entry is recomputed with one line saying so;
`cache=false` never touches the cache's folder; where the cache is reruns no job.

Real `snakemake` on the smoke config up to train_tokenizer (prepare_corpus, train_tokenizer: two cheap
jobs, one folder output feeding the other), real MLflow stores, the cache in a temporary folder
(`--config cache_dir=...`: the tests' environment turns it off otherwise, tests/conftest.py)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from steps.config import cell_config, load_config
from steps.core import runcache
from steps.tracking import store
from tests.conftest import DEFAULT, SMOKE, clean_env, snakemake

pytestmark = pytest.mark.slow  # real Snakemake DAGs

UNTIL = ("--until", "train_tokenizer")
JOBS = ("prepare_corpus", "train_tokenizer")
DATA = {"prepare_corpus": "results/data/corpus", "train_tokenizer": "results/data/tokenizer"}


def record(work: Path, stage: str) -> dict:
    return json.loads((work / "results" / stage / "main" / "metrics.json").read_text())


def log(work: Path, stage: str) -> str:
    return (work / "results" / "logs" / stage / "main.log").read_text()


def client(work: Path):
    return store.client(f"sqlite:///{work / 'results' / 'mlflow.db'}")


def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (relative path -> bytes), Snakemake's timestamp and metrics.json left out."""
    skip = {runcache.SNAKEMAKE_STAMP, "metrics.json"}
    files = [p for p in sorted(path.rglob("*")) if p.is_file() and p.name not in skip]
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in files}


def entries(cache: Path) -> dict[str, float]:
    """Every file of the cache's folder with its mtime (what a run that never touched it leaves alone)."""
    return {str(p): p.stat().st_mtime for p in cache.rglob("*")} if cache.exists() else {}


def histories(c, run_id: str) -> dict[str, list]:
    run = c.get_run(run_id)
    return {k: sorted((m.step, m.value) for m in c.get_metric_history(run_id, k)) for k in run.data.metrics}


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> tuple[Path, Path]:
    """(workdir, cache): the two jobs computed with the cache on, their entries saved."""
    root = tmp_path_factory.mktemp("runcache")
    work, cache = root / "first", root / "cache"
    snakemake(work, "--config", f"cache_dir={cache}", *UNTIL)
    for stage in JOBS:  # forked by the job server (workflow/rules/common.smk), the lab run's start and end too
        assert "no entry for" in log(work, stage) and "saved to" in log(work, stage), log(work, stage)
        assert "job server: forked from pid" in log(work, stage), log(work, stage)
    return work, cache


def test_a_restored_job_equals_the_computed_one_and_links_its_run(first, tmp_path):
    work, cache = first
    before = {stage: record(work, stage) for stage in JOBS}
    data = {stage: tree(work / DATA[stage]) for stage in JOBS}

    # the same DAG again in the same results/: restored, each metrics.json naming the run that computed it
    again = snakemake(work, "--config", f"cache_dir={cache}", "-R", "prepare_corpus", *UNTIL)
    for stage in JOBS:
        assert "restored from" in log(work, stage) and "the run that computed it" in log(work, stage)
        assert f"{stage}[main] ok: run" not in log(work, stage)  # the stage's job never started
        assert record(work, stage) == before[stage]
        assert tree(work / DATA[stage]) == data[stage]
    assert "run cache: 2 of 2 jobs restored" in again.stderr
    # the lab run's job table lists both, linked to their runs
    lab = client(work).search_runs(
        [client(work).get_experiment_by_name(f"{store.EXPERIMENT_PREFIX}/lab").experiment_id],
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )[0]
    assert lab.data.metrics["jobs_ok"] == 2

    # another results/ (another store), same cache: restored into new runs tagged with the run they stand for
    other = tmp_path / "other"
    snakemake(other, "--config", f"cache_dir={cache}", *UNTIL)
    for stage in JOBS:
        new, old = record(other, stage), before[stage]
        assert new["restored_from"] == old["run_id"] != new["run_id"]
        assert {k: new[k] for k in ("status", "metrics", "info", "config_hash")} == {
            k: old[k] for k in ("status", "metrics", "info", "config_hash")
        }
        assert tree(other / DATA[stage]) == data[stage]
        assert tree(other / "results" / stage / "main") == tree(work / "results" / stage / "main")
        run, orig = client(other).get_run(new["run_id"]), client(work).get_run(old["run_id"])
        assert run.data.tags["restored_from"] == old["run_id"]
        assert run.data.tags["restored_from_cache"].startswith(str(cache))
        assert run.data.params == orig.data.params
        assert histories(client(other), run.info.run_id) == histories(client(work), old["run_id"])
        assert [a.path for a in client(other).list_artifacts(run.info.run_id)] == [
            a.path for a in client(work).list_artifacts(old["run_id"])
        ]


def test_the_restore_imports_no_torch_mlflow_or_pandas(first):
    work, cache = first
    shell = snakemake(work, "-n", "-p", "-R", "train_tokenizer", "--until", "train_tokenizer").stdout
    line = next(ln for ln in shell.splitlines() if "python -m steps.core.runcache train_tokenizer" in ln)
    words = shlex.split(line.split(" > ")[0])
    args = words[words.index("steps.core.runcache") + 1 :]  # the stage and the job's arguments
    env = {**clean_env(), runcache.ENV: str(cache)}
    cmd = [sys.executable, "-X", "importtime", "-m", "steps.core.runcache", *args]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    imported = {ln.split("|")[-1].strip().split(".")[0] for ln in lines}
    assert not imported & {"torch", "mlflow", "pandas", "transformers", "datasets"}, imported


def test_a_corrupt_entry_is_recomputed_with_one_line(first, tmp_path):
    work, cache = first
    mine = tmp_path / "cache"
    shutil.copytree(cache, mine)
    [entry] = (mine / "train_tokenizer").iterdir()
    files = entry / "files.tar"
    files.write_bytes(files.read_bytes()[:-1000])  # cut short, as a copy killed midway leaves it

    proc = snakemake(tmp_path / "work", "--config", f"cache_dir={mine}", *UNTIL)
    lines = [ln for ln in log(tmp_path / "work", "train_tokenizer").splitlines() if ln.startswith("run cache:")]
    assert lines[0].startswith(f"run cache: entry {entry} is corrupt (files.tar has ")
    assert lines[0].endswith("; recomputing") and not any("restored" in ln for ln in lines)
    assert sum("is corrupt" in ln for ln in proc.stderr.splitlines()) == 1  # and once in the terminal
    assert "restored from" in log(tmp_path / "work", "prepare_corpus")  # the intact entry still restores
    new = record(tmp_path / "work", "train_tokenizer")
    assert "restored_from" not in new
    assert "restored_from" not in client(tmp_path / "work").get_run(new["run_id"]).data.tags
    # the recomputed job wrote its entry again: whole, and what the next run restores
    manifest, problem = runcache.check(entry, entry.name)
    assert problem is None and manifest["run_id"] == new["run_id"]


def test_cache_off_never_reads_or_writes_the_cache(first, tmp_path):
    work, cache = first
    seen = entries(cache)
    elsewhere = tmp_path / "never"
    snakemake(tmp_path / "work", "--config", "cache=false", f"cache_dir={cache}", *UNTIL)
    snakemake(tmp_path / "work2", "--config", "cache=false", f"cache_dir={elsewhere}", "--until", "prepare_corpus")
    assert entries(cache) == seen and not elsewhere.exists()
    assert "job server: forked from pid" in log(tmp_path / "work2", "prepare_corpus")  # one job: forked too
    for stage in JOBS:  # computed, not restored: the same data and numbers as the cache holds, timings aside
        assert "run cache" not in log(tmp_path / "work", stage)
        assert tree(tmp_path / "work" / DATA[stage]) == tree(work / DATA[stage])
        fresh, kept = record(tmp_path / "work", stage)["metrics"], record(work, stage)["metrics"]
        timed = {k for k in fresh if "time" in k or k.endswith("_per_s")}
        assert {k: v for k, v in fresh.items() if k not in timed} == {k: v for k, v in kept.items() if k not in timed}


def test_where_the_cache_is_reruns_nothing(first):
    work, _ = first
    for change in ("cache_dir=/elsewhere", "cache=false"):
        proc = snakemake(work, "-n", "--config", change, *UNTIL)
        out = proc.stdout + proc.stderr
        assert "Nothing to be done" in out or re.search(r"^total\s+0$", out, flags=re.M), out[-3000:]
    base = load_config(DEFAULT, SMOKE)
    moved = load_config(DEFAULT, SMOKE, overrides={"cache": False, "cache_dir": "/elsewhere"})
    for stage in JOBS:
        assert cell_config(moved, stage, "main") == cell_config(base, stage, "main")


def test_location_follows_the_knobs_then_the_environment():
    home = {"HOME": "/home/u"}
    assert runcache.location({"cache": True, "cache_dir": None}, home) == "/home/u/.cache/n00bgpt/runs"
    xdg = {**home, "XDG_CACHE_HOME": "/xdg"}
    assert runcache.location({"cache": True, "cache_dir": None}, xdg) == "/xdg/n00bgpt/runs"
    assert runcache.location({"cache": True, "cache_dir": None}, {**xdg, runcache.ENV: "/shared"}) == "/shared"
    assert runcache.location({"cache": True, "cache_dir": None}, {**xdg, runcache.ENV: "off"}) == runcache.OFF
    assert runcache.location({"cache": True, "cache_dir": "/mine"}, {**xdg, runcache.ENV: "off"}) == "/mine"
    assert runcache.location({"cache": False, "cache_dir": "/mine"}, xdg) == runcache.OFF
