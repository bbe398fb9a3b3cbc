"""Input faults as a user causes them (issue 33, item 6): each stops with one line naming the file or
config key and the fix, never a traceback, and nothing is decoded or planned wrong in silence.

- a Latin-1 corpus file (prepare_corpus.encoding), a gzip one, an unknown encoding
- a 0-byte MCQ CSV
- a corpus shorter than the block size
- a read-only results/ folder or mlflow.db (the Snakefile's onstart: `python -m steps.tracking.lab start`)
- an unknown perf cell (`select` or `baseline_cell`), and nested `--config` integers and booleans,
  through the real `snakemake -n`

Jobs run as Snakemake runs them (`python -m steps.<stage>`), without a tracking store (`--no-mlflow`:
the store is not what these faults are about, and the job's error path is the same with one).
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from steps.core import InputError
from steps.data.text import load_documents
from tests.conftest import clean_env, io_args, run_module, snakemake, stage_params

FRENCH = "ACT I. Ça fait très bien, señor: le garçon est déjà là.\n"  # Latin-1 bytes from offset 7
ENGLISH = "ACT II. The king speaks, the queen sleeps, and the crown is heavy.\n"


def job(workdir: Path, stage: str, params: dict, inputs: dict | None = None) -> subprocess.CompletedProcess:
    """One stage job, as its rule runs it, into `workdir/out`: the real `python -m steps.<stage>` in a
    fresh interpreter (not forked from the test's warm one: an import-time fault would hide there)."""
    cfg = {"stage": stage, "cell": "main", "params": params, "common": {"seed": 1, "device": "cpu", "threads": 1}}
    io = io_args(inputs or {}, {"data": str(workdir / "out" / "data")})
    args = ["--no-mlflow", "--out", str(workdir / "out"), *io, "--cfg", json.dumps(cfg)]
    return run_module(workdir, f"steps.{stage}", args, timeout=300, fork=False)


def assert_one_line(proc: subprocess.CompletedProcess, *words: str, code: int = 1) -> str:
    """The process failed with `code`, no traceback, and one line of its output names every word."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if all(w in line for w in words)]
    assert lines, f"no line names {words}:\n{out[-3000:]}"
    return lines[0]


def corpus(folder: Path, files: dict[str, bytes]) -> str:
    """Files of a local corpus in `folder`, and the glob that names them (prepare_corpus.source)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, raw in files.items():
        (folder / name).write_bytes(raw)
    return str(folder / "*")


# ---- corpus encodings -------------------------------------------------------------------------
def test_a_latin1_corpus_stops_naming_the_file_the_byte_and_the_knob(tmp_path):
    source = corpus(tmp_path / "plays", {"a.txt": FRENCH.encode("latin-1"), "b.txt": ENGLISH.encode()})
    proc = job(tmp_path, "prepare_corpus", stage_params("prepare_corpus", source=source))
    line = assert_one_line(proc, str(tmp_path / "plays" / "a.txt"), "byte 7 ", "not valid utf-8")
    assert "prepare_corpus.encoding" in line and """--config 'prepare_corpus={"encoding": "latin-1"}'""" in line
    assert not (tmp_path / "out" / "data").exists()


def test_the_encoding_knob_decodes_latin1_as_the_user_says(tmp_path):
    assert stage_params("prepare_corpus")["encoding"] == "utf-8"  # the schema's default
    source = corpus(tmp_path, {"a.txt": FRENCH.encode("latin-1"), "b.txt": ENGLISH.encode()})
    texts = [d["text"] for d in load_documents(source, encoding="latin-1")]
    assert texts == [FRENCH.strip(), ENGLISH.strip()]


def test_a_gzip_corpus_is_read_as_gzip_under_the_same_encoding_rules(tmp_path):
    source = corpus(
        tmp_path,
        {"a.md.gz": gzip.compress(b"# Hamlet\n\n**HAMLET**\n\nTo be, or *not* to be.\n"), "b.txt": ENGLISH.encode()},
    )
    docs = load_documents(source)
    assert docs[0]["text"] == "Hamlet\n\nHAMLET:\n\nTo be, or not to be." and docs[0]["title"] == "a"  # Markdown
    latin = corpus(tmp_path / "latin", {"a.txt.gz": gzip.compress(FRENCH.encode("latin-1"))})
    assert load_documents(latin, encoding="latin-1")[0]["text"] == FRENCH.strip()
    with pytest.raises(InputError, match=r"a\.txt\.gz: byte 7 of the decompressed text .*prepare_corpus\.encoding"):
        load_documents(latin)
    broken = corpus(tmp_path / "broken", {"c.txt.gz": ENGLISH.encode()})  # named .gz, not gzip
    with pytest.raises(InputError, match=r"c\.txt\.gz: cannot read it .*prepare_corpus\.source"):
        load_documents(broken)


def test_an_unknown_encoding_names_the_knob(tmp_path):
    source = corpus(tmp_path, {"b.txt": ENGLISH.encode()})
    with pytest.raises(InputError, match="prepare_corpus.encoding 'klingon' is not a known text encoding"):
        load_documents(source, encoding="klingon")


# ---- MCQ CSVs -----------------------------------------------------------------------------------
def test_a_zero_byte_csv_stops_naming_the_file(tmp_path):
    empty = tmp_path / "exam.csv"
    empty.touch()
    proc = job(tmp_path, "prepare_mcq", stage_params("prepare_mcq", source=str(empty)))
    line = assert_one_line(proc, str(empty), "empty file (0 bytes", "Kaggle-format")
    assert "point prepare_mcq.source at" in line  # the field to change, not "the config key"


def test_a_zero_byte_train_csv_in_a_kaggle_folder_names_the_file(tmp_path):
    from steps.mcq.data import load_splits

    (tmp_path / "train.csv").touch()
    with pytest.raises(InputError, match=r"train\.csv: empty file \(0 bytes"):
        load_splits(tmp_path)


# ---- a corpus too short for the model ----------------------------------------------------------
def test_a_corpus_shorter_than_the_block_size_names_its_tokens_and_the_knobs(tmp_path):
    import datasets

    from steps.gpt_train import load_data
    from steps.train_tokenizer import train_bpe

    texts = {"train": [ENGLISH] * 40, "validation": ["The king speaks."]}
    data = tmp_path / "corpus"
    datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in texts.items()}).save_to_disk(data)
    train_bpe(texts["train"], 300, 1).save_pretrained(str(tmp_path / "tokenizer"))
    with pytest.raises(InputError) as err:
        load_data(32, None, 0, str(data), str(tmp_path / "tokenizer"))
    message = str(err.value)
    assert message.startswith(f"{data}: the validation split has ") and "block size 32" in message
    assert "gpt_train.model.block_size" in message and "gpt_train.max_train_tokens" in message
    assert "\n" not in message


def test_a_corpus_without_a_word_min_count_times_names_the_word2vec_knobs():
    from steps.word2vec.corpus import vocabulary

    with pytest.raises(InputError) as err:
        vocabulary([["the", "king", "speaks"], ["the", "queen"]], 5, "results/data/corpus")
    message = str(err.value)
    assert message.startswith("results/data/corpus: 5 words, no word occurs min_count=5 times")
    assert "word2vec.min_count" in message and "\n" not in message


# ---- a read-only store --------------------------------------------------------------------------
def read_only(path: Path, cmd: list[str]) -> list[str]:
    """`cmd` run where `path` cannot be written, as a user makes it so: `chmod a-w`. Root writes
    through any mode bits, so under root (CI) `path` becomes a read-only bind mount in a private
    mount namespace (`unshare -rm`), or the test skips saying why."""
    if os.geteuid() != 0:
        for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        return cmd
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root, where chmod does not stop writes, and unshare -rm fails: {probe.stderr.strip()}")
    return ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$1" "$1" && shift && exec "$@"', "sh", str(path), *cmd]


@pytest.fixture
def writable_again(tmp_path):
    """Gives the folder back its write bits after a chmod (pytest removes tmp_path later)."""
    yield
    for p in [tmp_path, *tmp_path.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


@pytest.mark.parametrize("what", ["results", "mlflow.db"])
def test_a_read_only_store_stops_naming_the_path_and_the_fix(tmp_path, writable_again, what):
    results = tmp_path / "results"
    results.mkdir()
    db = results / "mlflow.db"
    with sqlite3.connect(db) as con:  # a store from an earlier run
        con.execute("CREATE TABLE runs (id TEXT)")
    before = db.read_bytes()
    lab_start = [sys.executable, "-m", "steps.tracking.lab", "start", "--uri", f"sqlite:///{db}"]
    proc = subprocess.run(
        read_only(results if what == "results" else db, lab_start),
        cwd=tmp_path,
        input="{}",
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    line = assert_one_line(proc, str(results if what == "results" else db), f"MLflow store {db} cannot be written")
    assert ("chmod -R u+w" in line or "remount" in line) and "tracking.uri" in line
    assert db.read_bytes() == before


# ---- the config, through the real snakemake -----------------------------------------------------
@pytest.mark.parametrize(
    "perf, key",
    [({"select": ["nope"]}, "perf.select"), ({"baseline_cell": "nope"}, "perf.baseline_cell")],
)
def test_an_unknown_perf_cell_stops_before_any_job(tmp_path, perf, key):
    proc = snakemake(tmp_path, "-n", "--config", f"perf={json.dumps(perf)}", check=False)
    line = assert_one_line(proc, f"config key '{key}'", "'nope'", "Fix:")
    assert "declared:" in line and "InputFunctionException" not in proc.stderr
    assert not (tmp_path / "results").exists()


def job_cfg(dry_run: str, stage: str) -> dict:
    """The --cfg JSON of the stage's job in `snakemake -n -p`'s printed shell commands."""
    for line in dry_run.splitlines():
        if f"python -m steps.{stage} " in line:
            args = shlex.split(line)
            return json.loads(args[args.index("--cfg") + 1])
    raise AssertionError(f"no job of {stage} in:\n{dry_run[-3000:]}")


def test_nested_config_integers_and_booleans_keep_their_types(tmp_path):
    nested = [
        'gpt_train={"max_steps": 10, "compile": false, "model": {"dropout": 0.1}}',
        'prepare_corpus={"max_documents": 5}',
    ]
    proc = snakemake(tmp_path, "-n", "-p", "--config", *nested)
    params = job_cfg(proc.stdout + proc.stderr, "gpt_train")["params"]
    assert params["max_steps"] == 10 and params["compile"] is False and params["model"]["dropout"] == 0.1
    assert job_cfg(proc.stdout + proc.stderr, "prepare_corpus")["params"]["max_documents"] == 5
    wrong = snakemake(tmp_path, "-n", "--config", 'gpt_train={"max_steps": "ten"}', check=False)
    assert_one_line(wrong, "config key 'gpt_train.max_steps' must be of type integer, got str 'ten'")
