"""The report's header: when its runs ran, from which commit, on which machine, by which command.
Read from the runs' provenance (each job run's `git_commit` and `host` tags, its lab run's
`machine.*` and `command` tags, steps/tracking/lab.py), never from the host that renders the report."""

from __future__ import annotations

import pandas as pd


def distinct(runs: pd.DataFrame, column: str) -> list[str]:
    """The different non-empty values of a runs column, sorted."""
    if column not in runs:
        return []
    return sorted({str(v) for v in runs[column].dropna() if str(v)})


def machine_line(tags: dict) -> str:
    """'<cpu>, <cores> cores, <memory> GiB, GPU: <gpus>' from a lab run's machine.* tags."""
    if "machine.cpu" not in tags:
        return ""
    line = f"{tags['machine.cpu']}, {tags.get('machine.cores', '?')} cores, {tags.get('machine.memory_gib', '?')} GiB"
    return line + f", GPU: {tags.get('machine.gpus', 'none')}"


def lab_tags(client, runs: pd.DataFrame) -> dict:
    """The tags of the lab run(s) these runs nest under (the latest one's where several)."""
    tags: dict = {}
    for lab_id in distinct(runs, "tags.mlflow.parentRunId"):
        try:
            run = client.get_run(lab_id)
        except Exception:  # noqa: BLE001 - a parent gone from the store: the header says less
            continue
        if run.data.tags.get("mlflow.runName", "").startswith("lab run") and run.info.start_time >= tags.get("_t", 0):
            tags = {**run.data.tags, "_t": run.info.start_time}
    return tags


def provenance(client, runs: pd.DataFrame) -> dict[str, str]:
    """{'date', 'commit', 'machine', 'hosts', 'command'}: what the header shows, '' where unknown."""
    if runs.empty:
        return {}
    ends = pd.to_datetime(runs["end_time"] if "end_time" in runs else runs.get("start_time"), utc=True).dropna()
    lab = lab_tags(client, runs)
    return {
        "date": ends.max().strftime("%Y-%m-%d %H:%M UTC") if len(ends) else "",
        "commit": ", ".join(distinct(runs, "tags.git_commit")),
        "machine": machine_line(lab),
        "hosts": ", ".join(distinct(runs, "tags.host")),
        "command": lab.get("command", ""),
    }


def lines(facts: dict[str, str]) -> list[tuple[str, str]]:
    """(label, value) of the header, known facts only."""
    labels = {"date": "runs ended", "commit": "git commit", "machine": "machine", "hosts": "host"}
    labels["command"] = "command"
    return [(label, facts[key]) for key, label in labels.items() if facts.get(key)]
