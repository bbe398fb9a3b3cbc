"""Foundation: config validation, tracking under concurrency, failure handling, data determinism."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from steps.config import CONFIG_DIR, ConfigError, cell_config, cells, load_config, validate_config
from tests.conftest import clean_env, mlflow_runs, run_stage, snakemake, stage_params


# ---- config ----------------------------------------------------------------------------------
def test_shipped_configs_validate_and_fill_defaults():
    default = load_config(CONFIG_DIR / "default.yaml")
    assert default["prepare_corpus"]["source"] == "builtin:shakespeare"
    assert default["prepare_corpus"]["max_documents"] == 0  # filled from the schema
    assert default["tracking"]["uri"] is None
    smoke = load_config(CONFIG_DIR / "default.yaml", CONFIG_DIR / "smoke.yaml")
    assert smoke["threads"] == 1 and smoke["prepare_corpus"]["source"] == "builtin:shakespeare"
    gpu = load_config(CONFIG_DIR / "default.yaml", CONFIG_DIR / "gpu.yaml")
    assert gpu["device"] == "cuda"


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"prepare_corpus": {"bogus": 1}}, ["prepare_corpus.bogus", "unknown"]),
        ({"prepare_corpus": {"val_fraction": "a lot"}}, ["prepare_corpus.val_fraction", "number"]),
        ({"threads": "two"}, ["'threads'", "integer"]),
        ({"device": "tpu"}, ["'device'", "one of"]),
        ({"nonsense_section": {}}, ["nonsense_section", "unknown"]),
    ],
)
def test_bad_config_names_key_and_type(bad, words):
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_snakemake_rejects_bad_config_before_any_job(tmp_path):
    proc = snakemake(tmp_path, "--config", "threads=many", check=False)
    assert proc.returncode != 0
    assert "threads" in proc.stderr and "integer" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_cells_select_narrows_and_rejects_unknown():
    cfg = {"m": {"cells": {"a": {"x": 1}, "b": {}}, "select": ["b"], "x": 0}}
    assert cells(cfg, "m") == ["b"]
    assert cell_config(cfg, "m", "a")["params"] == {"x": 1}
    with pytest.raises(ConfigError, match="unknown cells"):
        cells({"m": {"cells": {"a": {}}, "select": ["zz"]}}, "m")


# ---- tracking --------------------------------------------------------------------------------
JOB = textwrap.dedent("""
    import sys
    from steps.core import Stage
    def run(ctx):
        for i in range(int(ctx.params["n"])):
            ctx.log_metrics({"loss": 1.0 / (i + 1), "i": i}, step=i)
            ctx.flush()                      # worst case: one write transaction per step
        if ctx.params.get("fail"):
            raise RuntimeError("boom")
        return {"final": float(ctx.params["n"])}
    Stage("concurrency", run).main()   # run with -c: no module, so its name is given
""")


def _job(workdir: Path, cell: str, n: int, fail: bool = False) -> subprocess.Popen:
    cfg = {
        "stage": "concurrency",
        "cell": cell,
        "params": {"n": n, "fail": fail},
        "common": {"seed": 1, "tracking": {"uri": None}},
    }
    return subprocess.Popen(
        [sys.executable, "-c", JOB, "--cfg", json.dumps(cfg), "--out", f"results/concurrency/{cell}"],
        cwd=workdir,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_eight_concurrent_jobs_lose_no_run_and_no_metric(tmp_path):
    n = 40
    procs = [_job(tmp_path, f"c{i}", n) for i in range(8)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    from steps.tracking import store

    runs = mlflow_runs(tmp_path)
    assert len(runs) == 8 and set(runs["status"]) == {"FINISHED"}
    client = store.client(f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    for cell in (f"c{i}" for i in range(8)):
        rec = json.loads((tmp_path / "results" / "concurrency" / cell / "metrics.json").read_text())
        history = client.get_metric_history(rec["run_id"], "loss")
        assert sorted(m.step for m in history) == list(range(n))
        assert rec["metrics"]["final"] == n
    tags = runs.iloc[0]
    for key in (
        "tags.rule",
        "tags.cell",
        "tags.config_hash",
        "tags.git_commit",
        "tags.version.torch",
        "tags.version.mlflow",
        "params.n",
    ):
        assert key in runs.columns and isinstance(tags[key], str) and tags[key]


def test_failed_job_ends_failed_and_stale_running_run_is_closed(tmp_path):
    p = _job(tmp_path, "f", 3, fail=True)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "boom" in err
    failed = json.loads((tmp_path / "results/concurrency/f/failed.json").read_text())
    assert not (tmp_path / "results/concurrency/f/metrics.json").exists()
    runs = mlflow_runs(tmp_path).set_index("run_id")
    assert runs.loc[failed["run_id"], "status"] == "FAILED"
    assert "boom" in runs.loc[failed["run_id"], "tags.error"]

    # a job killed outright (SIGKILL) leaves its run RUNNING ...
    import signal
    import time

    k = _job(tmp_path, "k", 10_000)
    deadline = time.time() + 120
    while time.time() < deadline and not len(mlflow_runs(tmp_path).query("status == 'RUNNING'")):
        time.sleep(0.5)
    k.send_signal(signal.SIGKILL)
    k.wait()
    assert (mlflow_runs(tmp_path)["status"] == "RUNNING").sum() == 1
    # ... and the next invocation of the same job closes it
    again = _job(tmp_path, "k", 2)
    assert again.wait(timeout=120) == 0
    runs = mlflow_runs(tmp_path)
    assert (runs["status"] == "RUNNING").sum() == 0
    assert (runs["tags.cell"] == "k").sum() == 2
    assert "killed" in runs.query("`tags.cell` == 'k' and status == 'FAILED'")["tags.error"].iloc[0]


# ---- data determinism ------------------------------------------------------------------------
def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.suffix != ".json":  # state.json holds a fingerprint of the path
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_prepare_corpus_is_deterministic_by_seed(tmp_path):
    params = stage_params("prepare_corpus", val_fraction=0.1, max_documents=30)
    digests = []
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        work = tmp_path / name
        work.mkdir()
        run_stage(
            work,
            "prepare_corpus",
            params,
            common={"seed": seed},
        )
        digests.append(_digest(work / "results/data/corpus"))
    assert digests[0] == digests[1] != digests[2]


def test_bad_corpus_source_is_one_clear_error(tmp_path):
    params = stage_params("prepare_corpus", source=str(tmp_path / "nothing/*.txt"), val_fraction=0.1)
    proc = run_stage(tmp_path, "prepare_corpus", params, check=False)
    assert proc.returncode == 1
    assert "matches no files" in proc.stderr and "Traceback" not in proc.stderr


def test_yaml_exponent_without_dot_is_a_number_where_schema_says_number():
    """YAML 1.1 reads `1e-4` as a string; the schema's `number` wins, in cells too."""
    import yaml

    raw = yaml.safe_load("word2vec:\n  sample: 1e-3\n  cells:\n    sgd: {lr: 2e-2}\n")
    assert raw["word2vec"]["sample"] == "1e-3"
    cfg = validate_config(raw)
    assert cfg["word2vec"]["sample"] == 1e-3 and cfg["word2vec"]["cells"]["sgd"]["lr"] == 2e-2
    assert cell_config(cfg, "word2vec", "sgd")["params"]["lr"] == 2e-2
    with pytest.raises(ConfigError, match="word2vec.sample"):
        validate_config({"word2vec": {"sample": "lots"}})
