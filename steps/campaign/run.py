"""Run the plan within a time budget: each cell a subprocess with a timeout taken from what is
left, the report job last (its time reserved from the start), and a ledger (campaign.json) that
says, for every planned cell, what happened: ok | skipped | failed | timeout | not run, and why.

A cell that would start with less than `min_cell_s` left is not started: it and everything after
it are "not run: budget spent". A cell past its timeout gets SIGTERM (the job ends its MLflow run
FAILED and writes failed.json, steps/core/job.py), then SIGKILL 15 s later. The ledger is
rewritten after every cell, so a campaign killed from outside still leaves what it did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tqdm import tqdm

from steps.campaign.plan import Cell, report_cfg


class Ledger:
    """campaign.json: the campaign's facts and one entry per planned cell, in plan order."""

    def __init__(self, out: Path, facts: dict, plan: list[Cell]):
        self.path = out / "campaign.json"
        self.data = {**facts, "cells": {c.name: entry(c) for c in plan}}
        self.save()

    def set(self, cell: Cell, **kw) -> None:
        self.data["cells"][cell.name].update(kw)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def entry(c: Cell) -> dict:
    e = {"stage": c.stage, "cell": c.cell, "group": c.group, "metrics": c.outputs.get("metrics", "")}
    return e | ({"status": "skipped", "reason": c.skip} if c.skip else {"status": "planned"})


def job_status(out: Path, c: Cell) -> tuple[str, str]:
    """(status, reason) from the job's own record: metrics.json (ok | skipped) or failed.json."""
    metrics = out / c.metrics
    if metrics.exists():
        rec = json.loads(metrics.read_text())
        return rec["status"], rec.get("reason", "").removeprefix("skipped: ")
    failed = metrics.with_name("failed.json")
    if failed.exists():
        return "failed", json.loads(failed.read_text()).get("error", "")
    return "failed", "no metrics.json or failed.json (see its log)"


def run_cell(out: Path, c: Cell, timeout: float, env: dict) -> tuple[str, str, float]:
    """Run one job in `out`; (status, reason, seconds)."""
    log = out / "results" / "logs" / c.stage / f"{c.cell}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    (out / c.metrics).parent.mkdir(parents=True, exist_ok=True)
    for old in (out / c.metrics, (out / c.metrics).with_name("failed.json")):  # an earlier campaign's, same folder
        old.unlink(missing_ok=True)
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(c.argv(), cwd=out, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            return "timeout", f"stopped at its {timeout:.0f} s timeout (the budget left)", time.monotonic() - t0
    status, reason = job_status(out, c)
    return status, reason, time.monotonic() - t0


def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the job's process group (its own children too), SIGKILL after `grace` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_plan(out: Path, lab: dict, plan: list[Cell], settings: dict, budget: float, ledger: Ledger) -> list[Cell]:
    """Run the cells in order within `budget` seconds (the report's reserve included); returns
    the cells that were started (the report's inputs)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    deadline = time.monotonic() + budget - settings["report_reserve_s"]
    attempted: list[Cell] = []
    status: dict[str, str] = {}
    bar = tqdm([c for c in plan if not c.skip], desc="campaign", unit="cell")
    for c in bar:
        bar.set_postfix_str(c.name)
        left = deadline - time.monotonic()
        if left < settings["min_cell_s"]:
            ledger.set(c, status="not run", reason=f"budget spent ({budget:.0f} s; {max(left, 0):.0f} s left)")
            continue
        blocked = [a for a in c.after if status.get(a) != "ok"]
        if blocked:
            ledger.set(c, status="not run", reason=f"needs {', '.join(blocked)} (not ok)")
            status[c.name] = "not run"
            continue
        timeout = min(left, settings["cell_cap_s"])
        ledger.set(c, status="running", timeout_s=round(timeout, 1))
        st, reason, seconds = run_cell(out, c, timeout, env)
        status[c.name] = st
        attempted.append(c)
        ledger.set(c, status=st, reason=reason, seconds=round(seconds, 1))
        tqdm.write(f"{c.name}: {st} in {seconds:.0f} s{f' ({reason.splitlines()[0][:160]})' if reason else ''}")
    return attempted


def run_report(out: Path, lab: dict, attempted: list[Cell], ledger: Ledger, timeout: float) -> None:
    """The report stage over the cells that ran (rules/report.smk), in the reserved time."""
    outputs = {
        "index": "results/reports/index.md",
        "html": "results/reports/index.html",
        "plots": "results/reports/plots",
        "metrics": "results/reports/metrics.json",
    }
    rep = Cell("report", "main", "report", report_cfg(lab, attempted), outputs=outputs)
    rep.inputs = {c.name: c.metrics for c in attempted}
    ledger.data["report"] = {"status": "running"}
    st, reason, seconds = run_cell(out, rep, timeout, os.environ.copy())
    ledger.data["report"] = {"status": st, "reason": reason, "seconds": round(seconds, 1), "index": outputs["index"]}
    ledger.save()
