"""The lab run: one MLflow run per `snakemake` invocation, in the experiment `n00bgpt/lab`, that
every job's run is nested under (`mlflow.parentRunId`). The Snakefile opens it in `onstart` and
passes its id to the jobs in the environment (N00BGPT_LAB_RUN, steps/tracking/mlflow_run.py);
`onsuccess`/`onerror` close it FINISHED/FAILED with its jobs' counts (ok / failed / killed / skipped)
as its description and every job in its artifacts jobs.md / jobs.html (steps/tracking/jobs.py).
On failure it also prints each failed job's error line, read from the job's log, as the last thing
in the terminal (Snakemake's own message only points at the log file).

    python -m steps.tracking.lab start [--uri URI] < config.json     -> prints the run id
    python -m steps.tracking.lab end --run-id ID --status FINISHED|FAILED [--uri URI] [--snakemake-log PATH]
"""

from __future__ import annotations

import getpass
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

from mlflow.entities import Metric, Param

from steps import paths
from steps.commandline import parser as cli_parser
from steps.config import cells
from steps.tracking import store, views
from steps.tracking.describe import COMPARE_PATH, LAB_DESCRIPTION, NOTE, REPORT_PATH, ui_url
from steps.tracking.jobs import (
    Job,
    classify,
    command_signals,
    counts,
    markdown,
    read_cache_events,
    restored_jobs,
    signal_of,
    summary,
    write_tables,
)
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
    with store.write_lock(uri):
        store.retrying(views.save, c, exp, views.lab_view(), "lab runs")
    return run.info.run_id


def jobs_table(c, run_id: str, logs: dict | None = None, commands: dict | None = None) -> list[Job]:
    """The lab run's jobs (its child runs in every lab experiment), killed ones named with their signal
    (steps/tracking/jobs.py); `logs` maps (rule, cell) to the job's log, `commands` Snakemake's killed
    commands to their signal (snakemake_jobs)."""
    exps = [e.experiment_id for e in c.search_experiments() if e.name.startswith(store.EXPERIMENT_PREFIX + "/")]
    runs = store.retrying(c.search_runs, exps, filter_string=f"tags.mlflow.parentRunId = '{run_id}'", max_results=5000)
    rows = []
    for r in sorted(runs, key=lambda r: (r.data.tags.get("stage", ""), r.data.tags.get("cell", ""))):
        t = r.data.tags
        status = "running" if r.info.status == "RUNNING" else t.get("status", r.info.status.lower())
        restored = f"restored from the run cache: a new run for {t['restored_from']}" if t.get("restored_from") else ""
        job = Job(t.get("stage", "?"), t.get("cell", "?"), status, t.get("error") or t.get("reason") or restored,
                  link=ui_url("", r.info.experiment_id, r.info.run_id), run_id=r.info.run_id,
                  experiment_id=r.info.experiment_id, run_status=r.info.status)  # fmt: skip
        rows.append(classify(job, (logs or {}).get((job.stage, job.cell), ""), commands or {}))
    return rows


def snakemake_jobs(snakemake_log: str | None) -> tuple[dict, dict[str, str]]:
    """From Snakemake's log of this invocation: {(rule, cell): the failed job's log} (its "Error in rule"
    blocks, the rules' `log:`, never rebuilt here) and {command: signal} of the jobs a signal killed."""
    text = Path(snakemake_log).read_text(errors="replace") if snakemake_log and Path(snakemake_log).exists() else ""
    logs = {}
    for block in re.split(r"\n(?=Error in rule )", text)[1:]:
        rule = block.split(":", 1)[0].removeprefix("Error in rule ").strip()
        log = re.search(r"\n\s+log: (\S+)", block)
        logs[(rule, Path(log.group(1)).stem if log else "")] = log.group(1) if log else ""
    return logs, command_signals(text)


def failed_jobs(logs: dict, commands: dict[str, str], since: float) -> list[tuple[str, str]]:
    """(error line, where) of every job of this invocation that failed or was killed: the records our
    jobs leave (failed.json, written since `since`), then jobs Snakemake saw fail with no such record (a
    crash or a signal before the job could write one): the signal, else the error from the job's log."""
    out, seen = [], set()
    for rec in sorted([*paths.RESULTS.glob("*/*/failed.json"), *paths.RESULTS.glob("*/failed.json")]):
        if rec.stat().st_mtime >= since:
            r = json.loads(rec.read_text())
            log = logs.get((r.get("stage"), r.get("cell")))
            job = classify(Job(str(r.get("stage")), str(r.get("cell")), "failed", str(r.get("error"))), log, commands)
            out.append((f"{job.stage}[{job.cell}] {job.shown_status}: {job.why}", f"log {log}" if log else str(rec)))
            seen.add((r.get("stage"), r.get("cell")))
    for (rule, cell), log in logs.items():
        if (rule, cell) not in seen:
            name = signal_of(log, commands)
            out.append((f"{rule}[{cell}] killed ({name})" if name else error_line(log), f"log {log}"))
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
    """Close the lab run with its jobs' table; on FAILED print the failed and killed jobs' errors
    last, even when the store cannot be reached."""
    started = 0.0
    logs, commands = snakemake_jobs(snakemake_log)
    try:
        started = close(store.tracking_uri(uri), run_id, status, logs, commands)
    finally:
        if status == "FAILED":
            failed = failed_jobs(logs, commands, started)
            print(f"\n{len(failed)} job(s) failed or were killed:", file=sys.stderr)
            for line, where in failed:
                print(f"  {line}\n    ({where})", file=sys.stderr)


def close(uri: str, run_id: str, status: str, logs: dict | None = None, commands: dict | None = None) -> float:
    """End the lab run: its counts as metrics, every job in the artifacts jobs.md / jobs.html, the
    counts, those links and the jobs that did not succeed in its description; runs that killed jobs
    left RUNNING end KILLED. Returns the run's start time (s)."""
    c = store.client(uri)
    run = store.retrying(c.get_run, run_id)
    rows = jobs_table(c, run_id, logs, commands)
    events = read_cache_events(run_id)  # jobs the run cache restored (steps/core/runcache.py)
    rows = sorted(rows + restored_jobs(events, {j.run_id for j in rows}), key=lambda j: (j.stage, j.cell))
    head = run.data.tags.get(NOTE, "").removesuffix(": running.")
    with tempfile.TemporaryDirectory(prefix="lab-jobs-") as tmp:
        for path in write_tables(rows, f"{run.info.run_name}: {len(rows)} jobs", Path(tmp)):
            store.retrying(c.log_artifact, run_id, str(path))
    ts = int(time.time() * 1000)
    with store.write_lock(uri):
        for job in rows:
            if job.status == "killed" and job.run_status == "RUNNING":
                store.retrying(c.set_tag, job.run_id, "status", "killed")
                store.retrying(c.set_tag, job.run_id, "error", job.why)
                store.retrying(c.set_terminated, job.run_id, "KILLED")
        for exp, stage in sorted({(j.experiment_id, j.stage) for j in rows}):
            store.retrying(views.refresh, c, exp, stage)  # the params its cells differ in, as they stand
        metrics = [Metric(f"jobs_{s}", n, ts, 0) for s, n in counts(rows).items()]
        store.retrying(c.log_batch, run_id, metrics=metrics)
        store.retrying(c.set_tag, run_id, NOTE, description(head, status, rows, run.info.experiment_id, run_id))
        store.retrying(c.set_terminated, run_id, status)
    where = ui_url(uri, run.info.experiment_id, run_id) if uri.startswith("http") else "`python -m steps.ui`"
    for line in [e["line"] for e in events if e.get("event") == "corrupt" and e.get("line")]:
        print(line, file=sys.stderr)
    restored = sum(e.get("event") == "restored" for e in events)
    if restored:
        print(f"run cache: {restored} of {len(rows)} jobs restored, not recomputed (`--config cache=false`: none)",
              file=sys.stderr)  # fmt: skip
    print(f"MLflow: {run.info.run_name} {status} ({summary(rows)}); see {where}", file=sys.stderr)
    return run.info.start_time / 1000 - 1


def description(head: str, status: str, rows: list[Job], exp: str, run_id: str, shown: int = 30) -> str:
    """The lab run's description: counts, links to the full table, and the jobs that did not succeed
    (at most `shown`: it stays far below MLflow's 8,000-character tag limit)."""
    links = " · ".join(f"[{name}]({ui_url('', exp, run_id, name)})" for name in ("jobs.md", "jobs.html"))
    bad = [j for j in rows if j.status in ("failed", "killed")]
    text = f"{head}: {status.lower()} ({summary(rows)}).\n\nEvery job, with its run and reason: {links}."
    text += f"\n\nThe lab's report, its tables and plots: [{REPORT_PATH}index.html]({REPORT_PATH}index.html)"
    text += " (served beside this UI by `python -m steps.ui`), and what changed since the lab run before: "
    text += f"[{COMPARE_PATH}?a={run_id[:8]}]({COMPARE_PATH}?a={run_id[:8]}&b=previous), or any two lab runs: "
    text += f"[{COMPARE_PATH}]({COMPARE_PATH})."
    if bad:
        more = f"\n\n... and {len(bad) - shown} more in jobs.md." if len(bad) > shown else ""
        text += "\n\nJobs that did not succeed:\n\n" + markdown(bad[:shown]) + more
    return text


def main(argv: list[str] | None = None) -> None:
    ap = cli_parser("python -m steps.tracking.lab", __doc__.split("\n\n")[0])
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
