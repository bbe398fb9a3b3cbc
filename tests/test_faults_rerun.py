"""A finished DAG plus one change plans exactly the jobs the change touches, and a broken result is
redone, never trusted (issue 33, items 1 and 3; configs/README.md, "When a job reruns").

Real `snakemake` dry runs (`-n`) on a copy of the session's finished smoke DAG: the copy's files are
hard links (cheap; every change here replaces a file or moves it, never writes into one), its
`.snakemake/` a real copy. What each dry run plans is read from its job blocks (rule, cell, reason)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from steps.core.sources import CACHE
from tests.conftest import ROOT, SMOKE, clean_env, smoke_cells, snakemake, snakemake_cmd

pytestmark = pytest.mark.slow  # the session's smoke DAG, and a real Snakemake call per test

PARAMS_CHANGED = "Params have changed since last execution"
UPDATED_INPUT = "Input files updated by another job"  # what Snakemake says first for a consumer


def copy_dag(src: Path, dst: Path) -> Path:
    """A copy of a finished DAG's folder: results hard-linked (same mtimes), .snakemake/ copied."""

    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=True, copy_function=link, ignore=shutil.ignore_patterns(".snakemake"))
    shutil.copytree(src / ".snakemake", dst / ".snakemake", symlinks=True, ignore=shutil.ignore_patterns("locks"))
    return dst


def planned(proc: subprocess.CompletedProcess) -> dict[str, str]:
    """{"<rule>/<cell>": reason} of the jobs a dry run plans (`all` left out); {} for "Nothing to be done"."""
    parts = re.split(r"^\s*(?:local)?rule (\w+):$", proc.stdout + proc.stderr, flags=re.M)
    jobs = {}
    for rule, block in zip(parts[1::2], parts[2::2]):
        cell = re.search(r"^\s*wildcards: cell=([^,\s]+)", block, flags=re.M)
        reason = re.search(r"^\s*reason: (.*)$", block, flags=re.M)
        if rule != "all":
            jobs[f"{rule}/{cell[1] if cell else 'main'}"] = reason[1] if reason else ""
    return jobs


def dry_run(workdir: Path, *args: str, snakefile: Path | None = None) -> dict[str, str]:
    """The jobs `snakemake -n` plans in `workdir` (the project's Snakefile, or a copy's)."""
    if snakefile is None:
        proc = snakemake(workdir, "-n", *args, timeout=300)
    else:
        cmd = snakemake_cmd(workdir, "-n", *args)
        cmd[cmd.index("-s") + 1] = str(snakefile)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env())
        assert proc.returncode == 0, proc.stderr[-4000:]
    return planned(proc)


def every_job() -> set[str]:
    """Every job of the smoke DAG, "<rule>/<cell>", the report included."""
    return {f"{stage}/{cell}" for stage, cells in smoke_cells().items() for cell in cells} | {"report/main"}


@pytest.fixture
def finished(smoke_dag, tmp_path) -> Path:
    """A private copy of the finished smoke DAG."""
    return copy_dag(smoke_dag, tmp_path / "dag")


def overlay(tmp_path: Path, text: str) -> tuple[str, ...]:
    """`--configfile smoke.yaml <a YAML file with text>`: a change on top of the smoke config."""
    extra = tmp_path / "change.yaml"
    extra.write_text(text)
    return ("--configfile", str(SMOKE), str(extra))


def test_unchanged_plans_nothing(finished):
    """Nothing in a job's recorded params varies between calls (another folder, run id, order)."""
    assert dry_run(finished) == {}


def test_seed_reruns_every_job_for_its_params_and_opt_out(finished):
    jobs = dry_run(finished, "--config", "seed=7")
    assert set(jobs) == every_job()
    assert all(reason.startswith((PARAMS_CHANGED, UPDATED_INPUT)) for reason in jobs.values()), jobs
    assert all(
        jobs[j].startswith(PARAMS_CHANGED) for j in ("prepare_corpus/main", "prepare_mcq/main", "components/main")
    )
    assert dry_run(finished, "--config", "seed=7", "--rerun-triggers", "mtime", "input") == {}


def test_a_stage_knob_reruns_that_stage_and_the_report(finished, tmp_path):
    jobs = dry_run(finished, *overlay(tmp_path, "word2vec: {window: 3}\n"))
    w2v = {f"word2vec/{c}" for c in smoke_cells()["word2vec"]}
    assert set(jobs) == w2v | {"report/main"}
    assert all(jobs[j].startswith(PARAMS_CHANGED) for j in w2v), jobs


def test_one_cells_knob_reruns_that_cell_and_the_report(finished, tmp_path):
    jobs = dry_run(finished, *overlay(tmp_path, "word2vec: {cells: {gensim: {seeds: 2}}}\n"))
    assert set(jobs) == {"word2vec/gensim", "report/main"}
    assert jobs["word2vec/gensim"].startswith(PARAMS_CHANGED), jobs


def append(path: Path, text: str) -> None:
    """Add a line to a file of the copied checkout."""
    path.write_text(path.read_text() + text)


def test_a_source_edit_reruns_the_stages_that_import_it(finished, tmp_path):
    """On a copy of the checkout (the project's files are never edited): a comment changes nothing;
    code in steps/word2vec/train.py reruns word2vec alone; code in steps/models/gpt.py reruns the
    GPT stages that import it, not word2vec or the data stages."""
    tree = tmp_path / "tree"
    for part in ("steps", "workflow", "configs"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__", ".snakemake"))
    if CACHE.exists():  # the parsed modules, keyed by their bytes: the copy's parse stays warm
        (tree / ".snakemake").mkdir()
        shutil.copy2(CACHE, tree / CACHE.relative_to(ROOT))
    snakefile = tree / "workflow" / "Snakefile"
    train, gpt = tree / "steps/word2vec/train.py", tree / "steps/models/gpt.py"
    append(train, "\n# a comment\n")
    assert dry_run(finished, snakefile=snakefile) == {}
    append(train, "EDITED = True\n")
    jobs = dry_run(finished, snakefile=snakefile)
    assert set(jobs) == {f"word2vec/{c}" for c in smoke_cells()["word2vec"]} | {"report/main"}
    assert jobs["word2vec/gensim"].startswith(PARAMS_CHANGED), jobs
    shutil.copy2(ROOT / "steps/word2vec/train.py", train)
    append(gpt, "EDITED = True\n")
    jobs = dry_run(finished, snakefile=snakefile)
    # exactly every smoke job of the stages whose modules import steps/models/gpt.py (written out:
    # a stage that stops or starts importing it changes this list), and the report; no data stage
    expected = {f"{s}/{c}" for s in IMPORT_GPT for c in smoke_cells()[s]} | {"report/main"}
    assert set(jobs) == expected, (sorted(set(jobs) - expected), sorted(expected - set(jobs)))
    assert all(jobs[j].startswith((PARAMS_CHANGED, UPDATED_INPUT)) for j in jobs), jobs


# the smoke stages whose import closure holds steps.models.gpt, imports inside functions included
# (steps/core/sources.py reads them all): components, gpt_parity, gpt_train and mcq_finetune import it
# when the module loads, the others when a cell runs (`import steps.<stage>` leaves it out of sys.modules)
IMPORT_GPT = (
    "components",
    "gpt_parity",
    "gpt_train",
    "inference",
    "mcq_finetune",
    "minitorch",
    "perf",
    "scale",
    "sharding",
)


WOULD = "a real run moves it to metrics.json.broken and redoes its job"


def would_redo(proc: subprocess.CompletedProcess) -> set[str]:
    """The jobs ("<rule>/<cell>") whose metrics.json a dry run says a real run would move aside and redo."""
    found = re.findall(rf"^results/(\S+)/metrics\.json: .*; {WOULD}", proc.stderr, flags=re.M)
    return {"report/main" if job == "reports" else job for job in found}


def files_of(workdir: Path) -> dict[Path, bytes]:
    """Every file of a DAG's folder and its bytes, Snakemake's own `.snakemake/` left out."""
    return {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file() and ".snakemake" not in p.parts}


def set_aside_for_real(workdir: Path) -> subprocess.CompletedProcess:
    """A real run that runs no job of a finished DAG (`--until prepare_corpus`: done): what it moves
    aside, it moves as the Snakefile is read."""
    return snakemake(workdir, "--until", "prepare_corpus", timeout=300)


def test_a_dry_run_moves_nothing_and_says_what_a_real_run_redoes(tmp_path):
    """`snakemake -n` changes no file: it names each metrics.json it cannot trust and says a real run
    would move it aside and redo its job; the real run then does (issue 48)."""
    metrics = tmp_path / "results" / "prepare_corpus" / "main" / "metrics.json"
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"run_id": "trunc')
    before = files_of(tmp_path)
    dry = snakemake(tmp_path, "-n", timeout=300)
    assert "results/prepare_corpus/main/metrics.json: not valid JSON" in dry.stderr
    assert would_redo(dry) == {"prepare_corpus/main"}, dry.stderr[-3000:]
    assert files_of(tmp_path) == before  # nothing moved, nothing written
    real = snakemake(tmp_path, "--until", "prepare_corpus", timeout=600)
    assert "moved to metrics.json.broken, its job is redone" in real.stderr
    assert (metrics.parent / "metrics.json.broken").read_text() == '{"run_id": "trunc'
    assert re.search(r'"run_id": "\w+"', metrics.read_text())  # redone


def test_a_truncated_metrics_json_is_moved_aside_and_redone(finished):
    metrics = finished / "results" / "word2vec" / "gensim" / "metrics.json"
    text = metrics.read_text()
    metrics.unlink()  # a new file: the session's DAG shares the old one's inode
    metrics.write_text(text[: len(text) // 2])
    before = files_of(finished)
    proc = snakemake(finished, "-n", timeout=300)
    assert "results/word2vec/gensim/metrics.json: not valid JSON" in proc.stderr
    assert would_redo(proc) == {"word2vec/gensim"} and files_of(finished) == before  # a dry run moves nothing
    assert "moved to metrics.json.broken" in set_aside_for_real(finished).stderr
    assert set(dry_run(finished)) == {"word2vec/gensim", "report/main"}
    assert (metrics.parent / "metrics.json.broken").read_text() == text[: len(text) // 2]


def test_a_metrics_json_without_its_run_is_redone(finished):
    metrics = finished / "results" / "prepare_mcq" / "main" / "metrics.json"
    text = re.sub(r'"run_id": "\w+"', '"run_id": null', metrics.read_text())
    metrics.unlink()
    metrics.write_text(text)
    assert would_redo(snakemake(finished, "-n", timeout=300)) == {"prepare_mcq/main"}
    set_aside_for_real(finished)
    jobs = dry_run(finished)
    assert "prepare_mcq/main" in jobs and "mcq_finetune/finetuned_context" in jobs
    assert not {j for j in jobs if j.startswith(("word2vec/", "sharding/", "scale/"))}


def test_a_deleted_store_redoes_every_job(finished):
    (finished / "results" / "mlflow.db").unlink()
    before = files_of(finished)
    proc = snakemake(finished, "-n", timeout=300)
    assert "is not in the store" in proc.stderr
    assert would_redo(proc) == every_job() and files_of(finished) == before


def test_the_report_names_an_unreadable_record_in_one_line(tmp_path):
    from steps.core.errors import InputError
    from steps.report.gather import load_cell

    metrics = tmp_path / "metrics.json"
    metrics.write_text('{"stage": "perf", "metr')
    with pytest.raises(InputError) as err:
        load_cell(metrics, "perf", "baseline")
    assert str(metrics) in str(err.value) and "\n" not in str(err.value)
