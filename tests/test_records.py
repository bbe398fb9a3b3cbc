"""`python -m steps.record`: a dated record of a finished run, read from what the run left (the
report's tables and the MLflow store). The run here is small but real: a lab run, the two data
jobs and the report job run as Snakemake runs them, against a real SQLite store."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import pandas as pd
import pytest

from steps.campaign.record import slug
from steps.config import config_hash
from steps.record.read import read_record
from steps.record.write import RecordError, machine_of, main, write_record
from steps.tables import fmt
from steps.tracking import lab
from steps.tracking.provenance import git_commit, machine
from tests.conftest import run_stage, stage_params, tiny_texts

STAGES = {"prepare_corpus": ["main"], "train_tokenizer": ["main"]}
COMMAND = "snakemake --cores 2 --configfile configs/smoke.yaml"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, dict]:
    """A folder holding a finished run's results/: lab run, prepare_corpus, train_tokenizer, report."""
    work = tmp_path_factory.mktemp("record_run")
    texts = work / "texts"
    texts.mkdir()
    for i, text in enumerate(tiny_texts(12, 0)):
        (texts / f"doc{i:02d}.txt").write_text(text)
    uri = f"sqlite:///{work / 'results' / 'mlflow.db'}"
    corpus = stage_params("prepare_corpus", source=str(texts / "*.txt"), val_fraction=0.25)
    tokenizer = stage_params("train_tokenizer", vocab_size=300)
    config = {"seed": 1234, "prepare_corpus": corpus, "train_tokenizer": tokenizer}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)  # the store's default folder (steps.paths) is relative to the DAG's folder
        lab_id = lab.start(uri, config, COMMAND)
        mp.setenv("N00BGPT_LAB_RUN", lab_id)  # the jobs nest under it, as under Snakemake
        run_stage(work, "prepare_corpus", corpus)
        run_stage(work, "train_tokenizer", tokenizer)
        report = stage_params("report") | {"stages": [[s, cells] for s, cells in STAGES.items()]}
        inputs = {f"{s}/{c}": f"results/{s}/{c}/metrics.json" for s, cells in STAGES.items() for c in cells}
        run_stage(work, "report", report, inputs=inputs)
        lab.close(uri, lab_id, "FINISHED")
    return work, config


def table_row(text: str, first: str) -> list[str]:
    """The cells of the first Markdown table row whose first cell is `first`."""
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {first} |"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def test_record_of_a_finished_run(finished_run, tmp_path):
    work, config = finished_run
    path = write_record(work / "results", tmp_path / "docs" / "results")
    m, commit = machine(), git_commit()
    short = commit.split("-")[0][:7] + ("-dirty" if commit.endswith("-dirty") else "")
    assert path.name == f"{time.strftime('%Y-%m-%d', time.gmtime())}-{slug(m['cpu'], 24)}-{m['cores']}c-{short}.md"
    text = path.read_text()
    assert f"- **machine**: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB\n" in text
    assert f"- **CPU flags**: {m['cpu_flags']} (those of amx_bf16 " in text  # host kinds told apart by data
    assert read_record(path).host_kind == f"{m['cpu']}, {m['cores']} cores; CPU flags {m['cpu_flags']}"
    assert f"- **commit**: {commit}\n" in text
    assert f"- **config hash**: {config_hash(config)} " in text
    assert f"- **command**: `{COMMAND}`\n" in text
    assert "(jobs: 0 failed, 0 killed, 3 ok, 0 skipped)" in text

    for stage, key, label in (
        ("prepare_corpus", "train_words", "words in the train split"),
        ("train_tokenizer", "validation_chars_per_token", "characters per token (validation)"),
    ):
        rec = json.loads((work / "results" / stage / "main" / "metrics.json").read_text())
        value = fmt(float(rec["metrics"][key]))
        # the headline: one line per stage, the report's key number, the cell's run id
        head = table_row(text.split("## Headline", 1)[1], stage)
        assert head == [stage, "1", "1", "0", "0", f"{label}: {value} (main)", rec["run_id"]]
        # the stage's own table: the cell, its status, the number, the same run id
        row = table_row(text.split(f"## {stage}", 1)[1], "main")
        assert row[:2] == ["main", "ok"] and value in row and row[-1] == rec["run_id"]
    assert "http://" not in text  # run ids, not links to a server that is gone


def test_record_command_and_default_folder(finished_run, tmp_path, capsys):
    work, _ = finished_run
    main([str(work), "--out", str(tmp_path)])  # the folder holding results/ works too
    written = Path(capsys.readouterr().out.strip())
    assert written.parent == tmp_path and written.exists()


def test_no_finished_run_says_what_is_missing_and_how_to_make_it(tmp_path):
    (tmp_path / "results").mkdir()
    with pytest.raises(RecordError, match=r"results/reports/metrics\.json: missing.*snakemake --cores 2"):
        write_record(tmp_path, tmp_path / "out")
    with pytest.raises(SystemExit, match="python -m steps.record: .*no finished report"):
        main([str(tmp_path / "results"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_run_older_than_the_machine_tags():
    assert machine_of({"machine.cpu": "X", "machine.cores": "4"}) == ({"cpu": "X", "cores": "4"}, "")
    here, note = machine_of({"host": platform.node()})
    assert here == machine() and "probed when this record was written" in note
    assert machine_of({"host": "elsewhere"}) == ({}, "not recorded by the run (host elsewhere)")


def test_a_record_holds_the_tables_its_cells_logged(tmp_path):
    """A stage's logged tables (gpt_parity's planted bugs, a perf memory table) go into the record under
    the stage's table, cell first; one too long to read is named with its files, not copied."""
    from steps.record.write import MAX_ROWS, cell_tables

    bugs = tmp_path / "gpt_parity" / "tiny"
    bugs.mkdir(parents=True)
    pd.DataFrame({"bug": ["no_causal_mask"], "first flagged": ["h.0.attn"], "error": [0.4375]}).to_csv(
        bugs / "bugs.csv", index=False
    )
    (tmp_path / "gpt_parity" / "odd").mkdir()  # a cell that plants no bug logs no table
    lines = cell_tables(tmp_path, "gpt_parity", ["odd", "tiny"])
    assert lines[0] == "### gpt_parity: bugs"
    assert table_row("\n".join(lines), "tiny") == ["tiny", "no_causal_mask", "h.0.attn", "0.4375"]
    timeline = tmp_path / "perf" / "timeline"
    timeline.mkdir(parents=True)
    pd.DataFrame({"t": range(MAX_ROWS + 1)}).to_csv(timeline / "memory_timeline.csv", index=False)
    lines = cell_tables(tmp_path, "perf", ["timeline"])
    assert lines[:2] == ["### perf: memory_timeline", ""]
    assert lines[2].startswith(f"{MAX_ROWS + 1} rows, not copied here: `results/perf/timeline/memory_timeline.csv`")
