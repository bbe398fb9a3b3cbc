"""The stage contract (steps/core/stage.py): one Stage object per stage module, read by its rule, its
`main` and the report; and Snakemake as the single source of the paths every job gets."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys

import pytest

from steps.core.stage import Stage, load
from tests.conftest import ROOT, clean_env, smoke_cells, smoke_params, snakemake, stage_paths, stage_rules

# Columns a smoke cell's `run` does not return, each with why. Any other missing key fails: a
# renamed metric must not leave its report column silently empty.
EXPECTED_ABSENT = {
    ("gpt_train", "main", "ours/HF bf16"): "the smoke config benchmarks float32 only (gpt_train.bench.dtypes)",
}


def test_every_stage_rule_runs_a_module_with_its_stage_object():
    """Each stage rule (as Snakemake reads the workflow) names the module it runs, and carries its
    stage's name: the module's own (its results folder, its config section, its MLflow runs)."""
    rules = stage_rules()
    assert {"prepare_corpus", "word2vec", "perf", "sharding", "report"} <= set(rules)
    for name, module in rules.items():
        assert module == f"steps.{name}", f"rule {name} runs {module}: a stage rule is named after its module"
        stage = load(name)  # imports steps.<name>; the name comes from the module, never typed
        assert isinstance(stage, Stage) and stage.name == name and stage.module == module
        assert callable(stage.run)


def test_a_rule_naming_no_module_fails_while_planning(tmp_path):
    """A stage rule naming a module that does not exist stops the workflow at parse time, with the
    module's name (found with find_spec, never imported)."""
    for folder in ("workflow", "configs"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    perf = tmp_path / "workflow" / "rules" / "perf.smk"
    perf.write_text(perf.read_text().replace('stage_params("steps.perf")', 'stage_params("steps.perff")'))
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(tmp_path / "workflow" / "Snakefile"), "-n"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    log = out.stdout + out.stderr
    assert out.returncode != 0 and "`python -m steps.perff`, and there is no such module" in log, log[-3000:]


def test_stage_rejects_a_malformed_contract():
    with pytest.raises(ValueError, match="expected one of"):
        Stage("steps.x", lambda ctx: {}, columns={"loss": "metric.loss"})
    with pytest.raises(ValueError, match="derived"):
        Stage("steps.x", lambda ctx: {}, columns={"a": "metrics.a"}, derived={"r": ("ratio", "b", "c")})
    with pytest.raises(ValueError, match="headline"):
        Stage("steps.x", lambda ctx: {}, columns={"a": "metrics.a"}, headline=("A", "b", "max"))
    with pytest.raises(ValueError, match="headline_if column 'v'"):
        Stage("steps.x", lambda ctx: {}, columns={"a": "metrics.a"}, headline=("A", "a", "max"), headline_if=("v", 1))
    with pytest.raises(ValueError, match="headline_interval column 'lo'"):
        Stage(
            "steps.x",
            lambda ctx: {},
            columns={"a": "metrics.a"},
            headline=("A", "a", "max"),
            headline_interval=("lo", "a"),
        )
    with pytest.raises(ValueError, match="need a headline"):
        Stage("steps.x", lambda ctx: {}, columns={"a": "metrics.a"}, headline_none="nothing")
    assert Stage("steps.perf", lambda ctx: {}).name == "perf"


def test_headline_names_a_best_row_only_when_its_condition_holds():
    """The perf headline: the largest × baseline among cells whose interval excludes 1 ("faster"),
    not the largest number; when none qualifies, the stage's sentence instead of a cell."""
    import pandas as pd

    from steps.perf import STAGE
    from steps.report.gather import headline

    table = pd.DataFrame(
        {
            "cell": ["baseline", "noisy", "real", "slow", "skipped"],
            "status": ["ok", "ok", "ok", "ok", "skipped"],
            "× baseline": [1.02, 1.45, 1.21, 0.5, None],
            "low": [0.97, 0.8, 1.1, 0.4, None],
            "high": [1.07, 2.6, 1.33, 0.6, None],
            "vs baseline": ["A/A noise check: no difference", "no difference", "faster", "slower", None],
            "run_id": ["r0", "r1", "r2", "r3", "r4"],
        }
    )
    label, value, run_id = headline(table, STAGE)
    assert label.startswith("best speedup") and (value, run_id) == ("1.21 [1.1, 1.33] (real)", "r2")
    table.loc[2, "vs baseline"] = "no difference"
    label, value, run_id = headline(table, STAGE)
    assert (value, run_id) == ("none: no cell beat the baseline beyond noise", "")
    plain = Stage("steps.x", lambda ctx: {}, columns={"× baseline": "metrics.s"}, headline=("A", "× baseline", "max"))
    assert headline(table, plain) == ("A", "1.45 (noisy)", "r1")  # no condition: the largest number


def test_headline_names_its_denominator():
    """word2vec's best analogy accuracy says how many questions it is out of (the common set)."""
    import pandas as pd

    from steps.report.gather import headline
    from steps.word2vec import STAGE

    table = pd.DataFrame(
        {
            "cell": ["sgd", "minilm"],
            "status": ["ok", "ok"],
            "analogy acc, common questions": [0.0346, 0.802],
            "common questions": [2235, 2235],
            "run_id": ["r0", "r1"],
        }
    )
    label, value, run_id = headline(table, STAGE)
    assert "same questions" in label and run_id == "r1"
    assert value == "0.802 on 2,235 questions every cell's vocabulary answers (minilm)"
    with pytest.raises(ValueError, match="headline_of column 'n' is not a column"):
        Stage("steps.x", lambda ctx: {}, columns={"a": "metrics.a"}, headline=("A", "a", "max"), headline_of=("n", "x"))


def test_planning_imports_stay_light():
    """What the Snakefile imports to plan a DAG (config with its ladder expansion, hub) must not load
    torch, transformers or mlflow: each costs seconds on every snakemake call. Stage modules
    themselves import their libraries at the top."""
    code = (
        "import sys, steps.config, steps.hub, steps.config.ladder, steps.core.sources, steps.tracking.outputs; "
        "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'mlflow', 'jax') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=ROOT, check=True
    ).stdout.strip()
    assert out == "[]", out


def _cells():
    return [(s, c) for s, cs in smoke_cells().items() for c in cs] + [("report", "main")]


@pytest.mark.slow
@pytest.mark.parametrize("stage,cell", _cells(), ids=lambda x: x)
def test_report_columns_are_what_run_returns(smoke_dag, stage, cell):
    """Every column of the stage's contract against its cell's metrics.json on the smoke DAG:
    `metrics.X` a key of its metrics, `info.X` of its info, `params.X` a param of its MLflow run."""
    rec = json.loads((smoke_dag / stage_paths(stage, cell)[1]["metrics"]).read_text())
    if rec["status"] == "skipped":
        pytest.skip(f"{stage}/{cell} is skipped on this machine ({rec['reason']}): its columns are not checked here")
    assert rec["status"] == "ok", rec
    params = None
    missing = []
    contract = load(stage)
    filled = contract.columns_for(smoke_params(stage, cell)) if contract.columns_for else contract.columns
    for title, ref in contract.columns.items():
        if title not in filled:
            continue
        kind, _, key = ref.partition(".")
        if kind == "params":
            if params is None:
                from steps.tracking import store

                client = store.client(f"sqlite:///{smoke_dag / 'results/mlflow.db'}")
                params = client.get_run(rec["run_id"]).data.params
            found = key in params
        else:
            found = key in rec[kind]
        if not found and (stage, cell, title) not in EXPECTED_ABSENT:
            missing.append(f"{title!r} -> {ref}")
    assert not missing, f"{stage}/{cell}: run() returned no {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(smoke_cells()), ids=lambda x: x)
def test_curves_and_tables_the_report_reads_exist(smoke_dag, stage):
    """The names the report reads by string: each of a stage's `curves` is a metric some ok cell
    logged with steps (more than one point: a curve), each of its `tables` a csv some ok cell
    wrote (`<cell folder>/<name>.csv`); a renamed metric or table would draw nothing silently."""
    from steps.tracking import store

    contract = load(stage)
    recs = {c: json.loads((smoke_dag / stage_paths(stage, c)[1]["metrics"]).read_text()) for c in smoke_cells()[stage]}
    ok = {c: r for c, r in recs.items() if r["status"] == "ok"}
    if not (contract.curves or contract.tables) or not ok:
        pytest.skip(f"{stage}: no curves or tables, or no ok cell")
    client = store.client(f"sqlite:///{smoke_dag / 'results/mlflow.db'}")
    for key in contract.curves:
        points = {c: len(client.get_metric_history(r["run_id"], key)) for c, r in ok.items()}
        assert max(points.values()) > 1, f"{stage}: no cell logged a curve of {key!r} ({points})"
    for name in contract.tables:
        folders = [(smoke_dag / stage_paths(stage, c)[1]["metrics"]).parent for c in ok]
        assert any((f / f"{name}.csv").exists() for f in folders), f"{stage}: no cell wrote {name}.csv"


def _dry_run_jobs(workdir) -> list[tuple[str, dict, dict, dict]]:
    """(stage, cfg, inputs, outputs) of every job a dry run of the smoke DAG would start."""
    out = snakemake(workdir, "-n", "-p").stdout
    jobs = []
    for line in out.splitlines():
        if "python -m steps." not in line:
            continue
        # the stage's own command: after the run cache's check (`... || python -m steps.<stage> ...`)
        argv = shlex.split(line[line.rindex("python -m steps.") :].split(" >")[0])
        stage, pairs, cfg = argv[2].removeprefix("steps."), {"--input": {}, "--output": {}}, None
        for flag, value in zip(argv[3::2], argv[4::2]):
            if flag == "--cfg":
                cfg = json.loads(value)
            else:
                name, _, path = value.partition("=")
                pairs[flag][name] = path
        jobs.append((stage, cfg, pairs["--input"], pairs["--output"]))
    return jobs


@pytest.mark.slow
def test_jobs_get_their_paths_from_their_rules(tmp_path):
    """Each job's --input/--output on the command line Snakemake runs are what tests' run_stage
    passes (its rule's input functions applied to a cell with the job's resolved params, through
    Snakemake's API); the report's inputs are every other job's metrics.json, named <stage>/<cell>."""
    jobs = _dry_run_jobs(tmp_path)
    smoke = smoke_cells()
    assert sorted((s, c["cell"]) for s, c, _, _ in jobs if s != "report") == sorted(
        (s, c) for s, cs in smoke.items() for c in cs
    )
    metrics = {}
    for stage, cfg, inputs, outputs in jobs:
        if stage == "report":
            report_inputs = inputs
            assert outputs == stage_paths(stage)[1]
            continue
        assert (inputs, outputs) == stage_paths(stage, cfg["cell"], cfg["params"]), stage
        metrics[f"{stage}/{cfg['cell']}"] = outputs["metrics"]
    assert report_inputs == metrics
