"""One declaration per knob: StepOptions (steps/models/train_step.py) and GPTConfig
(steps/models/gpt.py) declare the step's and the model's knobs, their types, choices and
defaults; every stage schema entry for one of those keys must say the same (type, enum,
default), so a knob has one default whichever stage runs the step."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

from steps.config import CONFIG_DIR, MATRIX_KEYS, ConfigError, cell_config, cells, load_config, stage_schema
from steps.config.typed import JOB_KEYS
from steps.models.gpt import GPTConfig
from steps.models.train_step import StepOptions
from steps.word2vec.train import TrainOptions

# (stage, path of the sub-section in its schema, the dataclass whose fields it holds)
SECTIONS = [
    ("gpt_train", (), StepOptions),
    ("perf", (), StepOptions),
    ("gpt_train", ("model",), GPTConfig),
    ("perf", ("model",), GPTConfig),
    ("perf", (), GPTConfig),  # perf keeps attn and checkpoint_activations beside the step knobs
    ("word2vec", (), TrainOptions),  # the trainer's knobs (steps/word2vec/train.py)
    ("minitorch", ("gpt",), GPTConfig),
    ("minitorch", ("translate",), GPTConfig),
    ("sharding", ("gpt",), GPTConfig),
]
# sub-sections of a tiny model of their own: types and choices are GPTConfig's, the defaults their own
TINY_MODELS = {("minitorch", "gpt"), ("minitorch", "translate"), ("sharding", "gpt")}
# a stage default that differs from the dataclass's on purpose: (stage, key) -> why
STAGE_DEFAULTS = {("gpt_train", "model.vocab_size"): "null = the tokenizer's size"}
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", tuple: "array", dict: "object"}


def json_schema_of(annotation) -> dict:
    """{type[, enum]} of a dataclass field's annotation, as the schema writes it."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return {"type": JSON_TYPES[type(args[0])], "enum": list(args)}
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [json_schema_of(a)["type"] for a in args if a is not type(None)]
        return {"type": [*inner, "null"]}
    return {"type": JSON_TYPES[typing.get_origin(annotation) or annotation]}


def knob_entries():
    for stage, path, cls in SECTIONS:
        props = stage_schema(stage)
        for key in path:
            props = props["properties"][key]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in props["properties"]:
                yield stage, ".".join([*path, f.name]), props["properties"][f.name], hints[f.name], f.default


ENTRIES = list(knob_entries())


def test_the_stages_declare_the_step_and_model_knobs():
    keys = {(stage, key) for stage, key, *_ in ENTRIES}
    assert {("gpt_train", "adamw"), ("perf", "adamw"), ("gpt_train", "amp"), ("perf", "amp")} <= keys
    assert {("gpt_train", "model.n_embd"), ("perf", "model.n_embd"), ("perf", "attn")} <= keys


@pytest.mark.parametrize("stage,key,entry,annotation,default", ENTRIES, ids=[f"{e[0]}.{e[1]}" for e in ENTRIES])
def test_schema_entry_matches_the_dataclass(stage, key, entry, annotation, default):
    want = json_schema_of(annotation)
    if (stage, key) in STAGE_DEFAULTS:
        assert entry["default"] != default, f"{stage}.{key} now matches the dataclass: drop it from STAGE_DEFAULTS"
        return
    if (stage, key.rpartition(".")[0]) in TINY_MODELS:
        default = entry.get("default")
    default = list(default) if isinstance(default, tuple) else default
    assert entry.get("default") == default, f"workflow/schemas/{stage}.schema.yaml: {key} default"
    assert entry["type"] == want["type"], f"workflow/schemas/{stage}.schema.yaml: {key} type"
    assert entry.get("enum") == want.get("enum"), f"workflow/schemas/{stage}.schema.yaml: {key} choices"


def test_the_old_precision_name_says_what_it_became():
    with pytest.raises(ConfigError, match=r"gpt_train.dtype' was renamed to gpt_train.amp.*bfloat16 -> bf16"):
        load_config(CONFIG_DIR / "default.yaml", overrides={"gpt_train": {"dtype": "bfloat16"}})


# ---- typed sections: the stage reads its resolved section as a dataclass (steps/config/typed.py) ----------
def section_classes():
    from steps.components import ComponentsConfig
    from steps.data.config import PrepareCorpusConfig, TrainTokenizerConfig
    from steps.gpt_parity import GptParityConfig
    from steps.mcq.config import McqFinetuneConfig, PrepareMcqConfig
    from steps.minitorch.config import MinitorchConfig
    from steps.models.train_config import GptTrainConfig
    from steps.perf.config import PerfConfig
    from steps.report.config import ReportConfig
    from steps.scale.scale_config import ScaleConfig
    from steps.sharding.plan import Plan
    from steps.word2vec.config import Word2VecConfig

    return {
        "perf": PerfConfig,
        "gpt_train": GptTrainConfig,
        "prepare_corpus": PrepareCorpusConfig,
        "train_tokenizer": TrainTokenizerConfig,
        "prepare_mcq": PrepareMcqConfig,
        "word2vec": Word2VecConfig,
        "mcq_finetune": McqFinetuneConfig,
        "report": ReportConfig,
        "components": ComponentsConfig,
        "gpt_parity": GptParityConfig,
        "minitorch": MinitorchConfig,
        "scale": ScaleConfig,
        "sharding": Plan,
    }


@pytest.mark.parametrize("stage", list(section_classes()))
def test_every_schema_key_is_a_field_and_every_other_field_has_a_default(stage):
    cls = section_classes()[stage]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    # less the keys the job runner reads for every stage (steps/config/typed.py JOB_KEYS: a seed group),
    # unless the stage reads them too (word2vec's seeds)
    keys = set(stage_schema(stage)["properties"]) - set(MATRIX_KEYS) - (set(JOB_KEYS) - set(fields))
    assert keys <= set(fields), f"{cls.__name__} lacks {sorted(keys - set(fields))}"
    assert all(fields[k].default is not dataclasses.MISSING for k in set(fields) - keys), "a field outside the schema"


def schema_types(annotation) -> tuple[set, list | None]:
    """(JSON types, enum) of a section field's annotation: json_schema_of, plus the nested
    dataclasses (objects) and lists a section holds."""
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        return {"object"}, None
    if origin is list or annotation is list:
        return {"array"}, None
    if origin in (typing.Union, types.UnionType):
        inner = [schema_types(a) for a in typing.get_args(annotation) if a is not type(None)]
        return set().union(*(t for t, _ in inner)) | {"null"}, None
    want = json_schema_of(annotation)
    return {want["type"]}, want.get("enum")


def section_entries():
    for stage, cls in section_classes().items():
        props, hints = stage_schema(stage)["properties"], typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in props and f.name not in MATRIX_KEYS:
                yield stage, f.name, props[f.name], hints[f.name]


@pytest.mark.parametrize("stage,key,entry,annotation", list(section_entries()), ids=lambda v: str(v)[:40])
def test_every_section_field_has_its_schema_type_and_choices(stage, key, entry, annotation):
    """The schema holds the defaults; the dataclass the types: both say the same type and choices."""
    types_, enum = schema_types(annotation)
    got = entry["type"] if isinstance(entry["type"], list) else [entry["type"]]
    assert set(got) == types_, f"workflow/schemas/{stage}.schema.yaml: {key} type {got} vs {annotation}"
    if enum is not None:
        assert entry.get("enum") == enum, f"workflow/schemas/{stage}.schema.yaml: {key} choices"


def schema_default(entry: dict):
    """The default a schema entry fills in: its own, or for an object its properties' defaults."""
    if "default" in entry and entry["default"] != {}:
        return entry["default"]
    if entry.get("type") == "object" and "properties" in entry:
        return {k: schema_default(v) for k, v in entry["properties"].items() if "default" in v or "properties" in v}
    return entry.get("default")


@pytest.mark.parametrize("stage", list(section_classes()))
def test_a_default_a_section_dataclass_declares_is_the_schema_s(stage):
    """Defaults live in the schema; a section field that declares one too (a Plan written in code,
    the tests') must say the same, nested sections key by key."""
    props, cls = stage_schema(stage)["properties"], section_classes()[stage]
    checked = 0
    for f in dataclasses.fields(cls):
        if f.name not in props or f.name in MATRIX_KEYS:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        default = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        want = schema_default(props[f.name])
        if want in (None, {}):  # the schema sets none (e.g. sharding.mesh: every cell names its own)
            continue
        if isinstance(default, dict) and isinstance(want, dict):  # key by key, where both name the key
            both = set(default) & set(want)
            assert both, (stage, f.name, "the code's default and the schema's share no key")
            default, want = {k: default[k] for k in both}, {k: want[k] for k in both}
        assert kept(want, list(default) if isinstance(default, tuple) else default), (stage, f.name, default, want)
        checked += 1
    assert checked or not any(f.default is not dataclasses.MISSING for f in dataclasses.fields(cls) if f.name in props)


def kept(params, built) -> bool:
    """Every key of `params` is in `built` (the dataclass as a dict) with the same value."""
    if isinstance(params, dict):
        return isinstance(built, dict) and all(k in built and kept(v, built[k]) for k, v in params.items())
    if isinstance(params, list):
        return isinstance(built, (list, tuple)) and len(params) == len(built) and all(map(kept, params, built))
    return params == built


LAB_CONFIGS = {  # the DAGs' configs, and the GPU campaign's files (layered on default.yaml: steps/campaign/plan.py)
    "default": ["default.yaml"],
    "smoke": ["default.yaml", "smoke.yaml"],
    "gpu": ["default.yaml", "gpu.yaml"],
    "gpu-hub": ["default.yaml", "gpu.yaml", "hub.yaml"],
    "gpu-campaign": "gpu-campaign.yaml",
    "gpu-rehearse": "gpu-rehearse.yaml",
}


@pytest.mark.parametrize("name", LAB_CONFIGS)
def test_every_cell_builds_its_section_dataclass(name):
    """What each job of these DAGs will read, built here before any job runs."""
    from steps.campaign.plan import load_campaign

    configs = LAB_CONFIGS[name]
    if isinstance(configs, str):
        cfg = load_campaign(CONFIG_DIR / configs)[1]
    else:
        cfg = load_config(*(CONFIG_DIR / c for c in configs))
    for stage, cls in section_classes().items():
        for cell in cells(cfg, stage):
            params = cell_config(cfg, stage, cell)["params"]
            built = cls.of(params)
            names = {f.name for f in dataclasses.fields(cls)}
            params = {k: v for k, v in params.items() if k not in JOB_KEYS or k in names}  # the job's, not the stage's
            if issubclass(cls, StepOptions):
                assert StepOptions.from_params(built) == StepOptions.from_params(params), (stage, cell)
            else:
                assert kept(params, dataclasses.asdict(built)), (stage, cell)


def test_a_cell_s_partial_nested_object_gets_the_schema_defaults():
    """`gpt_train.cells.ft.lora: {r: 4}` (the stage's lora is null): the job sees the schema's alpha,
    dropout and targets beside r, as a stage-level `lora` would; a stage-level object's keys stay under
    the cell's (deep merge) and a cell without the key keeps the stage's."""
    cells_ = {"ft": {"lora": {"r": 4}}, "full": {}}
    cfg = load_config(CONFIG_DIR / "default.yaml", overrides={"gpt_train": {"cells": cells_}})
    lora = cell_config(cfg, "gpt_train", "ft")["params"]["lora"]
    assert lora["r"] == 4 and lora["alpha"] == 16 and lora["dropout"] == 0.0 and "c_fc" in lora["targets"]
    assert cell_config(cfg, "gpt_train", "full")["params"]["lora"] is None
    stage = {"lora": {"r": 2, "alpha": 8}, "cells": {"ft": {"lora": {"r": 4}}}}
    cfg = load_config(CONFIG_DIR / "default.yaml", overrides={"gpt_train": stage})
    assert cell_config(cfg, "gpt_train", "ft")["params"]["lora"]["alpha"] == 8


SECTION_ONLY = ("max_steps", "bench")


def test_curriculum_config_is_full_s_later_lessons_unchanged():
    """configs/curriculum.yaml validates on top of the default, and every cell it adds is configs/full.yaml's
    own (the same resolved settings), so the two cannot drift apart; the default's cells keep theirs."""
    default = load_config(CONFIG_DIR / "default.yaml")
    full = load_config(CONFIG_DIR / "default.yaml", CONFIG_DIR / "full.yaml")
    curriculum = load_config(CONFIG_DIR / "default.yaml", CONFIG_DIR / "curriculum.yaml")
    added = 0
    for stage in ("word2vec", "gpt_train", "perf", "sharding"):
        for cell in cells(curriculum, stage):
            if cell in cells(default, stage) and stage != "gpt_train":
                assert cell_config(curriculum, stage, cell) == cell_config(default, stage, cell), (stage, cell)
            elif cell not in cells(default, stage):
                # full.yaml's gpt_train section also trains main 120 steps and benchmarks bf16 (the
                # fine-tunings set their own steps and no benchmark): those two keys aside
                own = {k: v for k, v in cell_config(curriculum, stage, cell)["params"].items() if k not in SECTION_ONLY}
                theirs = {k: v for k, v in cell_config(full, stage, cell)["params"].items() if k not in SECTION_ONLY}
                assert own == theirs, (stage, cell)
                added += 1
    assert added >= 12, added
