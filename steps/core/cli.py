"""The command line of every stage job: `python -m steps.<stage> --cfg JSON [--input NAME=PATH ...]
[--output NAME=PATH ...] [--out DIR]`. The Snakefile passes the rule's named input and output paths
(workflow/rules/common.smk: `stage_io`); the job's folder is that of its `metrics` output."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from steps.commandline import parser


@dataclass
class JobArgs:
    cfg: dict
    out: Path
    inputs: dict[str, str]
    outputs: dict[str, str]
    mlflow: bool


def _pairs(items: list[str], flag: str, ap: argparse.ArgumentParser) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name:
            ap.error(f"{flag} {item!r}: expected NAME=PATH")
        out[name] = path
    return out


def parse_args(prog: str, argv: list[str] | None = None) -> JobArgs:
    ap = parser(prog)
    ap.add_argument("--cfg", required=True, help="resolved cell config as JSON (from the Snakefile)")
    ap.add_argument("--input", action="append", metavar="NAME=PATH", help="a named input of the rule")
    ap.add_argument(
        "--output",
        action="append",
        metavar="NAME=PATH",
        help="a named output of the rule; `metrics` (metrics.json) sets the job's folder",
    )
    ap.add_argument("--out", help="the job's folder, for a run by hand: same as --output metrics=DIR/metrics.json")
    ap.add_argument("--no-mlflow", action="store_true", help="run without tracking (debugging)")
    args = ap.parse_args(argv)
    outputs = _pairs(args.output, "--output", ap)
    if args.out:
        outputs.setdefault("metrics", str(Path(args.out) / "metrics.json"))
    if "metrics" not in outputs:
        ap.error("give --output metrics=PATH (or --out DIR)")
    return JobArgs(
        cfg=json.loads(args.cfg),
        out=Path(outputs["metrics"]).parent,
        inputs=_pairs(args.input, "--input", ap),
        outputs=outputs,
        mlflow=not args.no_mlflow,
    )
