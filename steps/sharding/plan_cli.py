"""The command line launch.py gives every process it starts (a rank, the JAX process): the cell's Plan."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from steps.sharding.plan import Plan


def plan_from_argv(argv=None):
    """`--plan JSON --out DIR`: the command line launch.py gives every process it starts."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True, help="the cell's Plan as JSON")
    ap.add_argument("--out", required=True, help="folder for rank<r>.json")
    args = ap.parse_args(argv)
    return Plan.from_params(json.loads(args.plan)), Path(args.out)
