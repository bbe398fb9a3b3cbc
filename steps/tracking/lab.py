"""The lab run: one MLflow run per `snakemake` invocation, in the experiment `n00bgpt/lab`, that
every job's run is nested under (`mlflow.parentRunId`). The Snakefile opens it in `onstart` and
passes its id to the jobs in the environment (N00BGPT_LAB_RUN, steps/tracking/mlflow_run.py);
`onsuccess`/`onerror` close it FINISHED/FAILED with a table of its jobs as the run's description.
On failure it also prints each failed job's error line, read from the job's log, as the last thing
in the terminal (Snakemake's own message only points at the log file).

    python -m steps.tracking.lab start [--uri URI] < config.json     -> prints the run id
    python -m steps.tracking.lab end --run-id ID --status FINISHED|FAILED [--uri URI] [--snakemake-log PATH]
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

from mlflow.entities import Metric, Param

from steps import paths
from steps.config import cells
from steps.tracking import store
from steps.tracking.describe import LAB_DESCRIPTION, NOTE, ui_url
from steps.tracking.mlflow_run import LAB_RUN_ENV
from steps.tracking.provenance import git_commit, machine

LAB = "lab"


def start(uri: str | None, config: dict, command: str = "") -> str:
    uri = store.init(uri)
    c = store.client(uri)
    exp = store.experiment_id(c, LAB, uri, LAB_DESCRIPTION)
    workdir = str(Path.cwd().resolve())
    for r in store.retrying(
        c.search_runs, [exp], filter_string=f"tags.workdir = '{workdir}' and attributes.status = 'RUNNING'"
    ):  # a snakemake killed outright never ran onerror
        with store.write_lock(uri):
            store.retrying(c.set_tag, r.info.run_id, "error", "killed: left RUNNING by an earlier snakemake")
            store.retrying(c.set_terminated, r.info.run_id, "FAILED")
    name = "lab run " + time.strftime("%Y-%m-%d %H:%M:%S")
    commit = git_commit()
    tags = {
        "mlflow.runName": name,
        "mlflow.source.name": "workflow/Snakefile",
        "mlflow.source.type": "JOB",
        "mlflow.user": getpass.getuser(),
        NOTE: f"`{command or 'snakemake'}` in `{workdir}`: running.",
        "workdir": workdir,
        "host": platform.node(),
        "git_commit": commit,
        "command": command[:5000],
        **{f"machine.{k}": v for k, v in machine().items()},
        **({"mlflow.source.git.commit": commit.removesuffix("-dirty")} if commit != "unknown" else {}),
    }
    params = {k: str(v) for k, v in config.items() if not isinstance(v, dict)}
    for stage, section in config.items():
        if isinstance(section, dict) and "cells" in section:
            params[f"{stage}.cells"] = ", ".join(cells(config, stage))[:6000]
    with store.write_lock(uri):
        run = store.retrying(c.create_run, exp, tags=tags, run_name=name)
        store.retrying(c.log_batch, run.info.run_id, params=[Param(k, v) for k, v in params.items()])
    store.retrying(c.log_text, run.info.run_id, json.dumps(config, indent=1, sort_keys=True), "config.json")
    return run.info.run_id


def jobs_table(c, run_id: str) -> tuple[list[dict], str]:
    """The lab run's jobs (its child runs in every lab experiment) and a Markdown table of them."""
    exps = [e.experiment_id for e in c.search_experiments() if e.name.startswith(store.EXPERIMENT_PREFIX + "/")]
    runs = store.retrying(c.search_runs, exps, filter_string=f"tags.mlflow.parentRunId = '{run_id}'", max_results=5000)
    rows = []
    for r in sorted(runs, key=lambda r: (r.data.tags.get("stage", ""), r.data.tags.get("cell", ""))):
        t = r.data.tags
        why = (t.get("error") or t.get("reason") or "").splitlines()[:1]
        rows.append(
            {
                "stage": t.get("stage", "?"),
                "cell": t.get("cell", "?"),
                "status": t.get("status", r.info.status.lower()),
                "link": f"[run]({ui_url('', r.info.experiment_id, r.info.run_id)})",
                "why": why[0][:200].replace("|", "/") if why else "",
            }
        )
    lines = ["| stage | cell | status | run | reason |", "|---|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['cell']} | {r['status']} | {r['link']} | {r['why']} |" for r in rows]
    return rows, "\n".join(lines)


def failed_jobs(snakemake_log: str | None, since: float) -> list[tuple[str, str]]:
    """(error line, where) of every job of this invocation that failed: the records our jobs leave
    (failed.json, written since `since`), then jobs Snakemake saw fail with no such record (a crash
    before the job could write one), their error from the job's log. Each job's log path is the one
    Snakemake's own log names for it (the rules' `log:`), never rebuilt here."""
    text = Path(snakemake_log).read_text(errors="replace") if snakemake_log and Path(snakemake_log).exists() else ""
    logs = {}  # (rule, cell) -> the job's log, from Snakemake's "Error in rule" blocks
    for block in re.split(r"\n(?=Error in rule )", text)[1:]:
        rule = block.split(":", 1)[0].removeprefix("Error in rule ").strip()
        log = re.search(r"\n\s+log: (\S+)", block)
        logs[(rule, Path(log.group(1)).stem if log else "")] = log.group(1) if log else ""
    out, seen = [], set()
    for rec in sorted([*paths.RESULTS.glob("*/*/failed.json"), *paths.RESULTS.glob("*/failed.json")]):
        if rec.stat().st_mtime >= since:
            r = json.loads(rec.read_text())
            log = logs.get((r.get("stage"), r.get("cell")))
            out.append(
                (f"{r.get('stage')}[{r.get('cell')}] failed: {r.get('error')}", f"log {log}" if log else str(rec))
            )
            seen.add((r.get("stage"), r.get("cell")))
    out += [(error_line(log), f"log {log}") for key, log in logs.items() if key not in seen]
    return out


def error_line(job_log: str) -> str:
    """The job's own one-line error ('<stage>[<cell>] failed: ...', steps/core/job.py), else
    the last lines of its log."""
    if not job_log or not Path(job_log).exists():
        return "(no log file)"
    lines = [ln for ln in Path(job_log).read_text(errors="replace").splitlines() if ln.strip()]
    ours = [ln for ln in lines if re.match(r"^\S+\[\S+\] failed: ", ln)]
    return ours[-1] if ours else "\n    ".join(lines[-3:]) or "(empty log)"


def end(uri: str | None, run_id: str, status: str, snakemake_log: str | None = None) -> None:
    """Close the lab run with its jobs' table; on FAILED print the failed jobs' errors last, even
    when the store cannot be reached."""
    started = 0.0
    try:
        started = close(store.tracking_uri(uri), run_id, status)
    finally:
        if status == "FAILED":
            failed = failed_jobs(snakemake_log, started)
            print(f"\n{len(failed)} job(s) failed:", file=sys.stderr)
            for line, where in failed:
                print(f"  {line}\n    ({where})", file=sys.stderr)


def close(uri: str, run_id: str, status: str) -> float:
    """End the lab run; returns its start time (s)."""
    c = store.client(uri)
    run = store.retrying(c.get_run, run_id)
    rows, table = jobs_table(c, run_id)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "skipped", "failed")}
    head = run.data.tags.get(NOTE, "").removesuffix(": running.")
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())

    ts = int(time.time() * 1000)
    with store.write_lock(uri):
        metrics = [Metric(f"jobs_{s}", n, ts, 0) for s, n in counts.items()]
        store.retrying(c.log_batch, run_id, metrics=metrics)
        store.retrying(c.set_tag, run_id, NOTE, f"{head}: {status.lower()} ({summary}).\n\n{table}"[:50000])
        store.retrying(c.set_terminated, run_id, status)
    where = ui_url(uri, run.info.experiment_id, run_id) if uri.startswith("http") else "`python -m steps.ui`"
    print(f"MLflow: {run.info.run_name} {status} ({summary}); see {where}", file=sys.stderr)
    return run.info.start_time / 1000 - 1


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m steps.tracking.lab", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["start", "end"])
    ap.add_argument("--uri", default=None, help="tracking URI (default: MLFLOW_TRACKING_URI, else results/mlflow.db)")
    ap.add_argument("--run-id", default=os.environ.get(LAB_RUN_ENV))
    ap.add_argument("--status", choices=["FINISHED", "FAILED"], default="FINISHED")
    ap.add_argument("--command", default="", help="the snakemake command line, recorded on the run")
    ap.add_argument("--snakemake-log", default=None, help="Snakemake's log of this invocation (failed jobs)")
    args = ap.parse_args(argv)
    if args.action == "start":
        print(start(args.uri, json.load(sys.stdin) if not sys.stdin.isatty() else {}, args.command))
    elif args.run_id:
        end(args.uri, args.run_id, args.status, args.snakemake_log)
    else:
        ap.error(f"end needs --run-id (or {LAB_RUN_ENV})")


if __name__ == "__main__":
    main()
