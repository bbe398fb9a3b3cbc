"""Run the plan within a time budget: each cell a subprocess with a timeout taken from what is
left, the report job last (its time reserved from the start), and a ledger (campaign.json) that
says, for every planned cell, what happened: ok | skipped | failed | timeout | not run, and why.

A cell that would start with less than `min_cell_s` left is not started: it and everything after
it are "not run: budget spent". A cell past its timeout gets SIGTERM (the job ends its MLflow run
FAILED and writes failed.json, steps/core/job.py), then SIGKILL 15 s later. A job whose campaign
dies (the device tool's kill at a call's limit) gets SIGTERM too (PR_SET_PDEATHSIG): it does not
run on, holding the GPU, into the next call.

The ledger lives in the campaign's --out folder (what the device call brings back: flat, a few
files), the jobs run in a work folder beside it. After every cell the ledger is rewritten with the
cell's own record embedded (its metrics.json, or failed.json and the tail of its log), so a
campaign killed from outside still leaves, in --out alone, everything the record needs
(`python -m steps.campaign.record OUT`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tqdm import tqdm

from steps.campaign.plan import Cell, report_cfg

LOG_TAIL = 40  # lines of a failed job's log kept in the ledger (the logs stay on the device machine)
PR_SET_PDEATHSIG = 1
_PRCTL = getattr(ctypes.CDLL(None), "prctl", None)  # looked up here, not in the forked child


class Ledger:
    """campaign.json: the campaign's facts and one entry per planned cell, in plan order."""

    def __init__(self, out: Path, facts: dict, plan: list[Cell]):
        self.path = out / "campaign.json"
        self.data = {**facts, "cells": {c.name: entry(c) for c in plan}}
        self.save()

    def set(self, cell: Cell, **kw) -> None:
        self.data["cells"][cell.name].update(kw)
        self.save()

    def finish(self, work: Path, cell: Cell, status: str, reason: str, seconds: float) -> None:
        """The cell's outcome and its own record (metrics.json / failed.json, a failed job's log tail)."""
        kw = {"status": status, "reason": reason, "seconds": round(seconds, 1)}
        rec = job_record(work, cell)
        if rec is not None:
            kw["record"] = rec
        if status != "ok":
            kw["log_tail"] = tail(work / log_path(cell), LOG_TAIL)
        self.data["cells"][cell.name].pop("pid", None)
        self.set(cell, **kw)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


def entry(c: Cell) -> dict:
    e = {"stage": c.stage, "cell": c.cell, "group": c.group, "metrics": c.outputs.get("metrics", "")}
    return e | ({"status": "skipped", "reason": c.skip} if c.skip else {"status": "planned"})


def log_path(c: Cell) -> str:
    return f"results/logs/{c.stage}/{c.cell}.log"


def tail(path: Path, n: int) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def job_record(work: Path, c: Cell) -> dict | None:
    """The job's own record: metrics.json, else failed.json marked `status: failed`; None if neither."""
    metrics = work / c.metrics
    if metrics.exists():
        return json.loads(metrics.read_text())
    failed = metrics.with_name("failed.json")
    if failed.exists():
        return {**json.loads(failed.read_text()), "status": "failed"}
    return None


def job_status(out: Path, c: Cell) -> tuple[str, str]:
    """(status, reason) from the job's own record: metrics.json (ok | skipped) or failed.json."""
    rec = job_record(out, c)
    if rec is None:
        return "failed", "no metrics.json or failed.json (see its log)"
    if rec["status"] == "failed":
        return "failed", rec.get("error", "")
    return rec["status"], rec.get("reason", "").removeprefix("skipped: ")


def own_session_ended_with_parent() -> None:
    """In the forked job, before exec: its own process group (stop() signals it whole), and
    SIGTERM when the campaign dies, so a killed campaign leaves no job running on."""
    os.setsid()
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def run_cell(out: Path, c: Cell, timeout: float, env: dict, started=None) -> tuple[str, str, float]:
    """Run one job in `out`; (status, reason, seconds). `started(pid)` is called once it runs."""
    log = out / log_path(c)
    log.parent.mkdir(parents=True, exist_ok=True)
    (out / c.metrics).parent.mkdir(parents=True, exist_ok=True)
    for old in (out / c.metrics, (out / c.metrics).with_name("failed.json")):  # an earlier campaign's, same folder
        old.unlink(missing_ok=True)
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            c.argv(), cwd=out, stdout=fh, stderr=subprocess.STDOUT, env=env, preexec_fn=own_session_ended_with_parent
        )
        if started:
            started(proc.pid)
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


def run_plan(
    out: Path, lab: dict, plan: list[Cell], settings: dict, budget: float, ledger: Ledger, after_cell=None
) -> list[Cell]:
    """Run the cells in order in the work folder `out` within `budget` seconds (the report's
    reserve included); `after_cell()` runs after each finished cell (the campaign rewrites its
    record). Returns the cells that were started (the report's inputs)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    deadline = time.monotonic() + budget - settings["report_reserve_s"]
    attempted: list[Cell] = []
    status: dict[str, str] = {}
    bar = tqdm([c for c in plan if not c.skip], desc="campaign", unit="cell")
    for c in bar:
        bar.set_postfix_str(c.name)
        if ledger.data["cells"][c.name].get("carried"):  # ok in an earlier call (--skip-done): its record restored
            status[c.name] = "ok"
            attempted.append(c)
            continue
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
        st, reason, seconds = run_cell(out, c, timeout, env, started=lambda pid, c=c: ledger.set(c, pid=pid))
        status[c.name] = st
        attempted.append(c)
        ledger.finish(out, c, st, reason, seconds)
        if after_cell:
            after_cell()
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
