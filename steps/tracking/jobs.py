"""The lab run's job table: every job of one `snakemake` invocation with its status, run link and
reason, logged on the lab run as artifacts `jobs.md` and `jobs.html` (a tag, the run's description
included, is cut at 8,000 characters by the SQL store, silently: a 90-job table stopped at job 59).

A job killed by a signal (the OOM killer, `kill -9`, a Ctrl-C that reached it) is reported as
`killed (SIGKILL)`, never as a failure whose reason is its log's last progress-bar line. The signal
comes from Snakemake's own log ("Command '... > <job log> 2>&1' returned non-zero exit status 137",
128 + N from the shell, or "died with <Signals.SIGKILL: 9>"), or from the job's own error when it
caught the signal (steps/core/job.py: "killed by signal 15"); a run still RUNNING when the DAG ends
belongs to a process that died without closing it.
"""

from __future__ import annotations

import html
import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from steps import paths

COMMAND_LINE = re.compile(r"Command '(.*)' (?:returned non-zero exit status (-?\d+)|died with <Signals\.(\w+): \d+>)")
CAUGHT = re.compile(r"killed by signal (\d+)")
# the ending steps/lifeline.py gives a job whose snakemake died (steps/core/job.py: failed.json, run FAILED)
ORPHANED = re.compile(r"killed: (.+) \(pid \d+\) is gone")
STATUSES = ("ok", "failed", "killed", "skipped")


@dataclass
class Job:
    stage: str
    cell: str
    status: str  # ok | failed | killed | skipped | running
    why: str = ""
    link: str = ""
    signal: str = ""  # the signal's name when killed
    run_id: str = ""
    experiment_id: str = ""
    run_status: str = ""  # MLflow's (RUNNING for a run its killed job never closed)

    @property
    def shown_status(self) -> str:
        return f"killed ({self.signal or 'signal unknown'})" if self.status == "killed" else self.status


def signal_name(number: int) -> str:
    """SIGKILL for 9; 'signal N' for a number no signal has."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_signal(code: int) -> str:
    """The signal an exit code stands for: a negative returncode (Python's subprocess) or 128 + N (a
    shell's status for a child killed by signal N); '' for an ordinary exit."""
    if code < 0:
        return signal_name(-code)
    return signal_name(code - 128) if 128 < code < 128 + 65 else ""


def command_signals(snakemake_log_text: str) -> dict[str, str]:
    """{command text: signal name} for every job command Snakemake saw killed by a signal."""
    out = {}
    for m in COMMAND_LINE.finditer(snakemake_log_text):
        name = m.group(3) or exit_signal(int(m.group(2)))
        if name:
            out[m.group(1)] = name
    return out


def signal_of(job_log: str, commands: dict[str, str]) -> str:
    """The signal that killed the job writing `job_log` (its command redirects into that log)."""
    if not job_log:
        return ""
    return next((name for command, name in commands.items() if job_log in command), "")


def caught_signal(error: str) -> str:
    """The signal a job caught and died of, from its own error line ('killed by signal 15')."""
    m = CAUGHT.search(error or "")
    return signal_name(int(m.group(1))) if m else ""


def classify(job: Job, job_log: str, commands: dict[str, str]) -> Job:
    """A failed or never-closed job that a signal ended becomes `killed` with the signal's name."""
    if job.status not in ("failed", "running"):
        return job
    gone = ORPHANED.search(job.why or "")
    if gone:  # not a failure of the job's own: its snakemake died and the lifeline ended it
        job.status, job.signal = "killed", f"its {gone.group(1)} died"
        return job
    name = caught_signal(job.why) or signal_of(job_log, commands)
    if name or job.status == "running":
        if not caught_signal(job.why):  # a SIGKILL leaves no error of the job's own: say what happened
            job.why = f"killed by {name}" if name else "its process ended without closing its run"
        job.status, job.signal = "killed", name
    return job


def counts(jobs: list[Job]) -> dict[str, int]:
    return {s: sum(j.status == s for j in jobs) for s in STATUSES}


def summary(jobs: list[Job]) -> str:
    """'88 ok, 1 failed, 1 killed, 2 skipped'."""
    return ", ".join(f"{n} {s}" for s, n in counts(jobs).items())


def markdown(jobs: list[Job], title: str = "") -> str:
    """The whole table, one row per job (no cut)."""
    rows = [f"| {j.stage} | {j.cell} | {j.shown_status} | {j.link and f'[run]({j.link})'} | {cell(j.why)} |"
            for j in jobs]  # fmt: skip
    head = [f"# {title}", ""] if title else []
    return "\n".join([*head, "| stage | cell | status | run | reason |", "|---|---|---|---|---|", *rows]) + "\n"


def cell(text: str) -> str:
    """One line of a reason, safe inside a Markdown table cell."""
    return (text.splitlines() or [""])[0][:200].replace("|", "/")


def html_page(jobs: list[Job], title: str) -> str:
    """The same table as a standalone page (MLflow's artifact viewer renders it): each run link opens a
    new tab, and in MLflow's sandboxed artifact frame a click opens it all the same (describe.FRAMED_LINKS)."""
    from steps.tracking.describe import FRAMED_LINKS, FRAMED_NOTE, NEW_TAB

    esc = html.escape
    rows = "".join(
        f'<tr class="{esc(j.status)}"><td>{esc(j.stage)}</td><td>{esc(j.cell)}</td><td>{esc(j.shown_status)}</td>'
        f"<td>{f'<a href={chr(34)}{esc(j.link)}{chr(34)} {NEW_TAB}>run</a>' if j.link else ''}</td>"
        f"<td>{esc(cell(j.why))}</td></tr>"
        for j in jobs
    )
    style = (
        "body{font-family:system-ui,sans-serif}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}th{background:#f0f0f0}"
        "tr.failed,tr.killed{background:#fdd}tr.skipped{background:#ffd}"
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{esc(title)}</title><style>{style}</style></head>"
        f"<body>{FRAMED_NOTE}<h1>{esc(title)}</h1><p>{esc(summary(jobs))}</p><table><tr><th>stage</th><th>cell</th>"
        f"<th>status</th><th>run</th><th>reason</th></tr>{rows}</table>{FRAMED_LINKS}</body></html>\n"
    )


def write_tables(jobs: list[Job], title: str, folder: Path) -> list[Path]:
    """jobs.md and jobs.html in `folder`, to be logged as the lab run's artifacts."""
    md, page = folder / "jobs.md", folder / "jobs.html"
    md.write_text(markdown(jobs, title))
    page.write_text(html_page(jobs, title))
    return [md, page]


def cache_events(lab_run: str) -> Path:
    """The run cache's events of one lab run, a JSON object a line: each job restored from the run
    cache (steps/core/runcache.py writes them), and each entry that failed its checks."""
    return paths.RESULTS / "logs" / "runcache" / f"{lab_run}.jsonl"


def read_cache_events(lab_run: str) -> list[dict]:
    try:
        lines = cache_events(lab_run).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line a killed job cut short
            pass
    return out


def restored_jobs(events: list[dict], listed: set[str]) -> list[Job]:
    """The jobs restored from the run cache whose run is the one that computed them (not among the
    lab run's child runs, `listed`): a row each, linked to that run."""
    from steps.tracking.describe import ui_url

    rows = []
    for e in events:
        if e.get("event") == "restored" and e.get("run_id") and e["run_id"] not in listed:
            why = "restored from the run cache: the run is the one that computed it"
            exp, run = str(e.get("experiment_id") or ""), e["run_id"]
            job = Job(str(e.get("stage")), str(e.get("cell")), str(e.get("status") or "ok"), why)
            job.link, job.run_id, job.experiment_id, job.run_status = ui_url("", exp, run), run, exp, "FINISHED"
            rows.append(job)
            listed.add(e["run_id"])
    return rows
