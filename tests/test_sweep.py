"""Sweeps (steps/config/sweep.py): one knob over values, each value a cell of its stage × its seeds.
The config expands them (names, values, select) or stops with one line; Snakemake plans one job per
value; the smoke DAG sweeps mcq_finetune's lr end to end: tagged MLflow runs with their seed runs and
a saved view, the report's `sweep` section (table + plot), `python -m steps.compare --sweep`."""

from __future__ import annotations

import json
import re
import shlex

import pandas as pd
import pytest

from steps.config import CONFIG_DIR, MATRIX_KEYS, ConfigError, cell_config, cells, load_config, validate_config
from steps.config import sweep as sweep_config
from steps.config.sweep import ONE_JOB, sweep_of, sweep_plan
from tests.conftest import DEFAULT, ROOT, SMOKE, mlflow_runs, run_module, smoke_workflow, snakemake

LR = {"mcq_finetune.lr": [1.0e-5, 3.0e-5, 1.0e-4]}


def test_a_sweep_adds_one_cell_per_value_to_its_stage_and_its_select():
    cfg = load_config(DEFAULT, overrides={"sweep": LR})
    names = ["sweep_lr_1e-05", "sweep_lr_3e-05", "sweep_lr_0.0001"]
    # the default selects both fine-tuned cells: they stay, the sweep's follow; its base is the first
    assert cells(cfg, "mcq_finetune") == ["finetuned_context", "finetuned_no_context", *names]
    base = cell_config(cfg, "mcq_finetune", "finetuned_context")["params"]
    for name, lr in zip(names, LR["mcq_finetune.lr"]):
        params = cell_config(cfg, "mcq_finetune", name)["params"]
        assert params == {**base, "lr": lr}  # the base cell with the knob set: its seeds (3) too
    assert params["seeds"] == 3 and params["train"] and params["use_context"]
    assert sweep_of(cfg, "mcq_finetune", names[1]) == {
        "sweep": "mcq_finetune.lr",
        "sweep_value": "3e-05",
        "sweep_order": "001",
    }
    assert sweep_of(cfg, "mcq_finetune", "finetuned_context") is None
    assert sweep_plan(cfg) == [
        {
            "sweep": "mcq_finetune.lr",
            "stage": "mcq_finetune",
            "knob": "lr",
            "base": "finetuned_context",
            "cells": [[n, v] for n, v in zip(names, LR["mcq_finetune.lr"])],
        }
    ]
    assert validate_config(load_config(DEFAULT, overrides={"sweep": LR})) is not None  # expanding twice: the same


def test_plain_stage_nested_knob_named_cell_and_value_names():
    """A stage without cells keeps `main` beside the sweep's; a nested knob is dotted; a named base cell
    goes into the name; values in value order, named by repr / text / position."""
    cfg = load_config(
        DEFAULT,
        overrides={
            "sweep": {
                "gpt_train.model.n_layer": [4, 1, 2],
                "minitorch.cells.classifier_fast.classifier.lr": [0.03, 0.001],
                "inference.cells.kv_cache.dtype": ["float64", "float32"],
            }
        },
    )
    assert cells(cfg, "gpt_train") == ["main", *(f"sweep_model.n_layer_{n}" for n in (1, 2, 4))]
    assert cfg["gpt_train"]["cells"]["main"] == {}  # the one job it was: the same config, no rerun
    assert cell_config(cfg, "gpt_train", "sweep_model.n_layer_2")["params"]["model"]["n_layer"] == 2
    mini = [c for c in cells(cfg, "minitorch") if c.startswith("sweep_")]
    assert mini == ["sweep_classifier_fast.classifier.lr_0.001", "sweep_classifier_fast.classifier.lr_0.03"]
    p = cell_config(cfg, "minitorch", mini[0])["params"]
    assert (p["kind"], p["backend"], p["classifier"]["lr"], p["seeds"]) == ("classifier", "fast", 0.001, 3)
    assert p["classifier"]["epochs"] == cfg["minitorch"]["classifier"]["epochs"]  # the rest of the knob's object
    inf = [c for c in cells(cfg, "inference") if c.startswith("sweep_")]
    assert inf == ["sweep_kv_cache.dtype_float64", "sweep_kv_cache.dtype_float32"]  # not numbers: as given
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+", c) for c in mini + inf)  # the {cell} wildcard's constraint
    assert sweep_config.value_name(1e20, 0) == "1e20" and sweep_config.value_name(True, 0) == "true"
    assert sweep_config.value_name("a b/c", 0) == "a-b-c" and sweep_config.value_name([1, 2], 2) == "v3"


def test_command_line_values_are_typed_by_the_knob():
    """`--config 'sweep={"gpt_train.max_steps": [10, 20]}'` reaches the lab as text (YAML BaseLoader)."""
    raw = load_config(DEFAULT)  # any validated config; the sweep arrives on the command line
    line = {"sweep": {"gpt_train.max_steps": ["10", "20"], "gpt_train.lr": ["1e-4"]}}
    cfg = validate_config({**raw, **line}, command_line=line)
    assert cfg["sweep"] == {"gpt_train.max_steps": [10, 20], "gpt_train.lr": [1e-4]}
    assert cells(cfg, "gpt_train") == ["main", "sweep_max_steps_10", "sweep_max_steps_20", "sweep_lr_0.0001"]


@pytest.mark.parametrize(
    "sweep, words",
    [
        ({"mcq_finetune.lrr": [1e-5]}, ["mcq_finetune has no knob 'lrr'", "lr,", "fix:"]),
        ({"gpt_train.model.width": [1]}, ["gpt_train.model has no knob 'width'", "n_embd", "fix:"]),
        ({"nope.lr": [1e-5]}, ["'nope' is not a stage", "fix:"]),
        ({"prepare_corpus.max_documents": [10]}, ["writes one output for the whole DAG", "fix:"]),
        ({"mcq_finetune.select": [["a"]]}, ["has no knob 'select'"]),
        ({"mcq_finetune.lr": []}, ["has no values", "fix: give it a non-empty list"]),
        ({"mcq_finetune.lr": [1e-5, "fast"]}, ["the value 'fast'", "'lr' must be of type number", "fix:"]),
        ({"gpt_train.max_steps": [0]}, ["the value 0", "max_steps", "fix:"]),
        ({"mcq_finetune.cells.nope.lr": [1e-5]}, ["names the cell 'nope'", "declared", "fix:"]),
        ({"mcq_finetune.lr": [1e-4, 0.0001]}, ["same value twice", "fix:"]),
    ],
    ids=[
        "unknown-knob",
        "unknown-nested",
        "unknown-stage",
        "one-job",
        "matrix-key",
        "empty",
        "wrong-type",
        "out-of-range",
        "unknown-cell",
        "duplicate",
    ],  # fmt: skip
)
def test_a_bad_sweep_stops_with_one_line_naming_the_key_and_the_fix(sweep, words):
    with pytest.raises(ConfigError) as err:
        load_config(DEFAULT, overrides={"sweep": sweep})
    message = str(err.value)
    assert "\n" not in message, message
    assert f"'sweep.{next(iter(sweep))}'" in message, message
    for w in words:
        assert w in message, message


def test_one_job_stages_and_matrix_keys_match_the_workflow():
    """sweep.ONE_JOB: the rules without a {cell} wildcard, as Snakemake parses them; its MATRIX_KEYS the config's."""
    rules = [r for r in smoke_workflow().rules if hasattr(r.params, "stage")]
    assert sorted(ONE_JOB) == sorted(r.name for r in rules if "cell" not in r.wildcard_names)
    assert sweep_config.MATRIX_KEYS == MATRIX_KEYS


def test_the_example_sweep_file_runs_three_cells():
    cfg = load_config(DEFAULT, CONFIG_DIR / "sweeps" / "mcq_lr.yaml")
    assert [c for c in cells(cfg, "mcq_finetune") if c.startswith("sweep_")] == [
        "sweep_lr_1e-05",
        "sweep_lr_3e-05",
        "sweep_lr_0.0001",
    ]
    assert (CONFIG_DIR / "sweeps" / "mcq_lr.yaml").read_text().startswith("# snakemake --cores 2 --configfile")


def test_snakemake_plans_one_job_per_value_each_training_its_seeds(tmp_path):
    """A real dry run (the smoke config, its sweep replaced on the command line): 3 values plan 3
    mcq_finetune jobs beside finetuned_context, each job's config trains its 2 seeds (3 × 2 seed
    runs) and carries the sweep's tags; no other stage gains a job."""
    values = [1e-5, 3e-5, 1e-4]
    line = "sweep=" + json.dumps({"mcq_finetune.lr": values})
    proc = snakemake(tmp_path, "-n", "-p", "--config", line)
    out = proc.stdout + proc.stderr
    stats = job_stats(out)
    assert stats["mcq_finetune"] == 1 + 3
    plain = job_stats(snakemake(tmp_path, "-n").stdout)  # the smoke's own sweep: 2 values
    assert {k: v for k, v in stats.items() if k != "mcq_finetune"} == {
        k: v for k, v in plain.items() if k != "mcq_finetune"
    }
    configs = {}
    for line in out.splitlines():  # each job's shell line (-p): its --cfg, the job's config
        if line.startswith("Shell command:") and "metrics=results/mcq_finetune/" in line:
            args = shlex.split(line.removeprefix("Shell command:").split(" > ", 1)[0])
            cfg = json.loads(args[args.index("--cfg") + 1])
            configs[cfg["cell"]] = cfg
    swept = {c: cfg for c, cfg in configs.items() if c.startswith("sweep_")}
    assert sorted(swept) == sorted(["sweep_lr_1e-05", "sweep_lr_3e-05", "sweep_lr_0.0001"]), sorted(configs)
    assert sum(cfg["params"]["seeds"] for cfg in swept.values()) == 3 * 2
    assert sorted(cfg["params"]["lr"] for cfg in swept.values()) == values
    assert {cfg["sweep"]["sweep"] for cfg in swept.values()} == {"mcq_finetune.lr"}
    assert "sweep" not in configs["finetuned_context"]  # a cell of no sweep: its config as it was


def job_stats(out: str) -> dict[str, int]:
    """Snakemake's "Job stats" table (job, count) from a dry run's output."""
    block = out.split("Job stats:", 1)[1].split("total", 1)[0]
    rows = [line.split() for line in block.splitlines()[3:] if line.strip()]
    return {name: int(count) for name, count in rows}


def test_report_section_formats_intervals_and_plots_on_a_log_axis(tmp_path):
    """sweep_section on records alone (no MLflow run): `mean [low, high] (n seeds)`, value order, the
    plot on a log x axis (values spanning 100×), sweep.csv with the numbers."""
    from steps.report import sweep as report_sweep

    sweep = {"sweep": "mcq_finetune.lr", "stage": "mcq_finetune", "knob": "lr", "base": "finetuned_context"}
    sweep["cells"] = [["sweep_lr_1e-05", 1e-5], ["sweep_lr_0.001", 1e-3]]

    def rec(m, lo, hi):
        return {"status": "ok", "run_id": "", "metrics": {"test_map3": m, "test_map3_low": lo, "test_map3_high": hi,
                                                          "test_map3_sd": 0.01, "seeds": 2.0}}  # fmt: skip

    records = {"mcq_finetune": {"sweep_lr_1e-05": rec(0.4, 0.3, 0.5), "sweep_lr_0.001": rec(0.6, 0.55, 0.65)}}
    plots = tmp_path / "plots"
    plots.mkdir()
    md, html, figs = report_sweep.sweep_section([sweep], records, pd.DataFrame(), tmp_path, plots, "")
    assert md.startswith("## sweep\n") and "### mcq_finetune.lr" in md
    assert "| 1e-05 | sweep_lr_1e-05 |  | ok | 0.4 [0.3, 0.5] (2 seeds) |" in md
    assert md.index("sweep_lr_1e-05") < md.index("sweep_lr_0.001")
    assert html.startswith("<h2 id='sweep'>") and len(figs) == 1 and figs[0].exists()
    numbers = pd.read_csv(tmp_path / "sweep.csv")
    assert list(numbers["MAP@3 high"]) == [0.5, 0.65] and list(numbers["MAP@3 seeds"]) == [2, 2]
    raw = report_sweep.sweep_table(sweep, records["mcq_finetune"], pd.DataFrame())[1]
    import matplotlib.pyplot as plt

    seen = {}
    save = plt.Figure.savefig
    plt.Figure.savefig = lambda fig, *a, **k: seen.setdefault("x", fig.axes[0].get_xscale())
    try:
        report_sweep.sweep_figure(sweep, raw, "MAP@3", plots)
    finally:
        plt.Figure.savefig = save
    assert seen["x"] == "log"


# ---- the smoke DAG's sweep: mcq_finetune.lr at 2 values, 2 seeds each ------------------------------
@pytest.mark.slow
def test_smoke_sweep_runs_tagged_seed_groups_with_a_saved_view(smoke_dag):
    smoke = load_config(DEFAULT, SMOKE)
    (sweep,) = sweep_plan(smoke)
    assert sweep["sweep"] == "mcq_finetune.lr" and len(sweep["cells"]) >= 2
    runs = mlflow_runs(smoke_dag)
    for order, (cell, value) in enumerate(sweep["cells"]):
        rec = json.loads((smoke_dag / "results" / "mcq_finetune" / cell / "metrics.json").read_text())
        seeds = cell_config(smoke, "mcq_finetune", cell)["params"]["seeds"]
        assert rec["status"] == "ok" and rec["metrics"]["seeds"] == seeds == 2, rec
        run = runs.set_index("run_id").loc[rec["run_id"]]
        assert (run["tags.sweep"], run["tags.sweep_order"]) == ("mcq_finetune.lr", f"{order:03d}")
        assert float(run["tags.sweep_value"]) == value and float(run["params.lr"]) == value
        children = runs[runs["tags.seed_of"] == rec["run_id"]]  # each seed one run nested under the cell's
        assert sorted(children["tags.seed"].astype(int)) == [1234, 1235], children
        assert set(children["tags.mlflow.parentRunId"]) == {rec["run_id"]}
        assert set(children["tags.sweep"]) == {"mcq_finetune.lr"} and set(children["status"]) == {"FINISHED"}
    tagged = runs[runs["tags.sweep"] == "mcq_finetune.lr"]  # the runs a search by the tag finds
    assert len(tagged) == len(sweep["cells"]) * (1 + 2)

    from steps.tracking import store, views

    client = store.client(f"sqlite:///{smoke_dag / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("n00bgpt/mcq_finetune")
    view = views.current(exp, views.sweep_key("mcq_finetune.lr"))
    assert view["searchFilter"] == "tags.sweep = 'mcq_finetune.lr'" and view["orderByKey"] == "tags.`sweep_order`"
    assert views.current(exp)["orderByKey"] == "tags.`view_order`"  # the stage's own view stays


@pytest.mark.slow
def test_smoke_report_shows_the_sweep_table_and_plot(smoke_dag):
    (sweep,) = sweep_plan(load_config(DEFAULT, SMOKE))
    reports = smoke_dag / "results" / "reports"
    index = (reports / "index.md").read_text()
    section = index.split("\n## sweep\n", 1)[1]
    assert "[sweep](#sweep)" in index and "### mcq_finetune.lr" in section
    rows = [line for line in section.splitlines() if line.startswith("| ") and "sweep_lr_" in line]
    assert [r.split(" | ")[1] for r in rows] == [c for c, _ in sweep["cells"]]  # value order
    assert all(re.search(r"\| \d\S* \[\S+, \S+\] \(2 seeds\) \|", r) for r in rows), rows
    assert "![sweep_mcq_finetune.lr](plots/sweep_mcq_finetune.lr.png)" in section
    assert (reports / "plots" / "sweep_mcq_finetune.lr.png").stat().st_size > 5_000
    numbers = pd.read_csv(reports / "sweep.csv")
    assert list(numbers["cell"]) == [c for c, _ in sweep["cells"]] and (numbers["MAP@3 seeds"] == 2).all()
    assert (numbers["MAP@3 low"] <= numbers["MAP@3"]).all() and (numbers["MAP@3"] <= numbers["MAP@3 high"]).all()
    assert "<h2 id='sweep'>" in (reports / "index.html").read_text()


@pytest.mark.slow
def test_compare_sweep_lists_the_values_in_order(smoke_dag):
    (sweep,) = sweep_plan(load_config(DEFAULT, SMOKE))
    uri = f"sqlite:///{smoke_dag / 'results' / 'mlflow.db'}"
    proc = run_module(ROOT, "steps.compare", ["--tracking-uri", uri, "--sweep"], env_extra={"COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("== sweep mcq_finetune.lr: 2 value(s) of mcq_finetune")
    assert lines[1].split()[:4] == ["value", "cell", "status", "seeds"]
    assert [line.split()[1] for line in lines[2:4]] == [c for c, _ in sweep["cells"]]
    assert all(line.split()[3] == "2" and " [" in line for line in lines[2:4])  # seeds, mean [low, high]
    args = ["--tracking-uri", uri, "--sweep", "mcq_finetune.lr", "--format", "json"]
    data = json.loads(run_module(ROOT, "steps.compare", args).stdout)
    rows = data["sweeps"]["mcq_finetune.lr"]
    assert [r["cell"] for r in rows] == [c for c, _ in sweep["cells"]] and {r["seeds"] for r in rows} == {2}
    bad = run_module(ROOT, "steps.compare", ["--tracking-uri", uri, "--sweep", "nope.lr"])
    assert bad.returncode != 0 and "no sweep 'nope.lr'" in bad.stderr and "mcq_finetune.lr" in bad.stderr
