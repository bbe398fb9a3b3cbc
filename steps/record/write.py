"""A dated record of a finished DAG, the modded-nanogpt `records/` habit:

    python -m steps.record RESULTS_DIR [--out docs/results]
    python -m steps.record --publish [--check]     # README and write-ups from the records

reads what the run left in RESULTS_DIR (a DAG folder's `results/`, or the folder holding it): the
report's tables (`reports/<stage>.csv`, written by the report job from the MLflow store) and the
store itself (`mlflow.db`: the report's run, the lab run of the invocation it belongs to), and
writes `<out>/<date>-<machine>-<commit>.md`: the date of the run, the machine (CPU model, cores,
memory, GPUs: the lab run's `machine.*` tags), the git commit, the config hash, the command, one
headline line per stage and each stage's table, every row with its MLflow run id. The headline is
the report's own (steps/report/gather.py: `headline_row`), recomputed from its tables.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from steps.campaign.record import slug
from steps.compare import CompareError, open_store
from steps.config import RUN_CACHE_KEYS, config_hash
from steps.core.cli import parser as cli_parser
from steps.core.stage import presentation
from steps.report.gather import headline_row, logged_tables
from steps.report.render import with_seed_intervals
from steps.tables import to_markdown
from steps.tracking.provenance import CPU_FLAGS, machine

RUN_IT = (
    "run the DAG to its end in the folder that holds results/ (`snakemake --cores 2`, with the "
    "--configfile/--config the run used), then give that folder"
)
# a logged table longer than this (a memory timeline, a partition sweep) is named, not copied into the record
MAX_ROWS = 100


class RecordError(Exception):
    """The folder holds no finished run: the message names the file, what is missing and the fix."""


def results_of(folder: Path) -> Path:
    """`folder` itself when it is a results folder, else `folder/results`."""
    return folder if (folder / "reports").is_dir() or (folder / "mlflow.db").exists() else folder / "results"


def report_record(results: Path) -> dict:
    """The report job's metrics.json: its MLflow run id, and proof that the report finished."""
    path = results / "reports" / "metrics.json"
    if not path.exists():
        raise RecordError(f"{path}: missing, so this folder has no finished report; {RUN_IT}")
    rec = json.loads(path.read_text())
    if rec.get("status") != "ok" or not rec.get("run_id"):
        raise RecordError(f"{path}: status {rec.get('status')!r}, run id {rec.get('run_id')!r}, not a finished report")
    return rec


def is_stage(section: str) -> bool:
    """A section of the report that is a lab stage (the sweep section, a smoke DAG's too, is not one)."""
    try:
        presentation(section)
    except LookupError:
        return False
    return True


def stage_order(results: Path) -> list[str]:
    """The report's stages in DAG order: its index.md's sections (each has its table)."""
    index = results / "reports" / "index.md"
    if not index.exists():
        raise RecordError(f"{index}: missing, so this folder has no finished report; {RUN_IT}")
    stages = [line[3:].strip() for line in index.read_text().splitlines() if line.startswith("## ")]
    stages = [s for s in stages if s != "Headline" and is_stage(s)]
    missing = [s for s in stages if not (results / "reports" / f"{s}.csv").exists()]
    if missing or not stages:
        raise RecordError(f"{results / 'reports'}: no table for {', '.join(missing) or 'any stage'}; {RUN_IT}")
    return stages


def machine_of(tags: dict) -> tuple[dict, str]:
    """The lab run's `machine.*` tags; a run older than them gets this host's, when it ran here."""
    recorded = {k.removeprefix("machine."): v for k, v in tags.items() if k.startswith("machine.")}
    if recorded:
        return recorded, ""
    if tags.get("host") == platform.node():
        return machine(), f"probed when this record was written, on the run's own host {platform.node()}"
    return {}, f"not recorded by the run (host {tags.get('host', 'unknown')})"


def machine_text(m: dict) -> str:
    if not m:
        return "unknown"
    gpus = m.get("gpus", "none")
    cpu = f"{m.get('cpu', 'unknown CPU')}, {m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB"
    return cpu + ("" if gpus == "none" else f"; GPUs: {gpus}")


def machine_slug(m: dict) -> str:
    """`amd-epyc-2c` for a CPU host, the GPU's name (`h100-80gb-hbm3`) for a GPU host."""
    gpus = m.get("gpus", "none")
    if gpus and not gpus.startswith("none"):
        return slug(gpus.split(";")[0].split(",")[0].removeprefix("NVIDIA "))
    return f"{slug(m.get('cpu', 'unknown'), 24)}-{m.get('cores', '')}c" if m else "unknown-machine"


def run_facts(client, report_run_id: str) -> dict:
    """Date, commit, command, config hash, wall time and machine of the invocation that wrote the report."""
    report = client.get_run(report_run_id)
    lab_id = report.data.tags.get("mlflow.parentRunId")
    run = client.get_run(lab_id) if lab_id else report  # a report run by hand has no lab run
    tags = run.data.tags
    config = "unknown (no lab run)"
    if lab_id:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                saved = Path(client.download_artifacts(lab_id, "config.json", tmp))
                # where the run cache was is not what the config computes: off, on or elsewhere, one hash
                lab_config = json.loads(saved.read_text())
                config = config_hash({k: v for k, v in lab_config.items() if k not in RUN_CACHE_KEYS})
            except Exception as exc:  # noqa: BLE001 - artifacts moved with the folder: say so, keep the rest
                config = f"unknown (the lab run's config.json: {str(exc)[:120]})"
    m, note = machine_of(tags)
    start, end = run.info.start_time / 1000, (run.info.end_time or 0) / 1000
    return {
        "date": time.strftime("%Y-%m-%d", time.gmtime(start)),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start)),
        "wall": f"{(end - start) / 60:.1f} min" if end > start else "unknown",
        "status": run.info.status,
        "commit": tags.get("git_commit", "unknown"),
        "command": tags.get("command") or "unknown",
        "config_hash": config,
        "lab_run": lab_id or "none",
        "jobs": ", ".join(f"{int(v)} {k.removeprefix('jobs_')}" for k, v in sorted(run.data.metrics.items())),
        "machine": m,
        "machine_note": note,
        "versions": {k.removeprefix("version."): v for k, v in report.data.tags.items() if k.startswith("version.")},
    }


def stage_tables(results: Path, stages: list[str]) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """The report's headline (one row per stage) and its per-stage tables, read back from its CSVs."""
    heads, tables = [], {}
    for stage in stages:
        ids = {"cell": str, "run_id": str, "experiment_id": str}
        table = pd.read_csv(results / "reports" / f"{stage}.csv", dtype=ids)
        table[["run_id", "experiment_id"]] = table[["run_id", "experiment_id"]].fillna("")
        heads.append(headline_row(stage, table, presentation(stage)))
        shown = with_seed_intervals(table.drop(columns=["experiment_id"]))  # "mean [low, high] (n seeds)"
        if shown["reason"].isna().all():
            shown = shown.drop(columns=["reason"])
        tables[stage] = shown.rename(columns={"run_id": "MLflow run id"})
    head = pd.DataFrame(heads).drop(columns=["experiment_id"]).rename(columns={"run_id": "MLflow run id"})
    return head, tables


def record_name(facts: dict) -> str:
    commit = facts["commit"]
    short = commit.split("-")[0][:7] + ("-dirty" if commit.endswith("-dirty") else "")
    return f"{facts['date']}-{machine_slug(facts['machine'])}-{short}.md"


def render(results: Path) -> tuple[str, str]:
    """(file name, Markdown) of the record of the finished run in `results`."""
    report = report_record(results)
    db = results / "mlflow.db"
    try:
        client, _uri = open_store(f"sqlite:///{db.resolve()}")
    except CompareError as exc:
        raise RecordError(f"{db}: {exc}") from None
    facts = run_facts(client, report["run_id"])
    head, tables = stage_tables(results, stage_order(results))
    versions = ", ".join(f"{k} {v}" for k, v in sorted(facts["versions"].items()))
    note = f" ({facts['machine_note']})" if facts["machine_note"] else ""
    lines = [
        f"# {facts['date']}: {machine_text(facts['machine'])}, commit {facts['commit'][:10]}",
        "",
        f"- **run**: started {facts['started']}, wall {facts['wall']}, {facts['status']} (jobs: {facts['jobs']})",
        f"- **machine**: {machine_text(facts['machine'])}{note}",
        f"- **CPU flags**: {facts['machine'].get('cpu_flags', 'not recorded by the run')} "
        f"(those of {' '.join(CPU_FLAGS)} in /proc/cpuinfo: they tell host kinds apart)",
        f"- **commit**: {facts['commit']}",
        f"- **config hash**: {facts['config_hash']} (steps.config.config_hash of the lab run's config.json)",
        f"- **command**: `{facts['command']}`",
        f"- **versions**: {versions}",
        f"- **lab run**: {facts['lab_run']}; every table row names its MLflow run id: serve the run's store with "
        "`python -m steps.ui` in its folder, or list the runs with `python -m steps.compare`",
        "",
        "Written by `python -m steps.record` from the run's report tables (`results/reports/<stage>.csv`) "
        "and its MLflow store. Timings are this machine's, under whatever else ran on it.",
        "",
        "## Headline",
        "",
        to_markdown(head),
    ]
    for stage, table in tables.items():
        lines += [f"## {stage}", "", to_markdown(table)]
        lines += cell_tables(results, stage, list(table["cell"]))
    return record_name(facts), "\n".join(lines)


def cell_tables(results: Path, stage: str, cells: list[str]) -> list[str]:
    """The tables the stage's cells logged (its presentation's `tables`: <results>/<stage>/<cell>/<name>.csv,
    stacked with a `cell` column), each under its own heading; one too long to read is named instead."""
    folders = {cell: results / stage / cell for cell in cells}
    lines = []
    for name, df in logged_tables(folders, presentation(stage).tables).items():
        df = df[["cell", *[c for c in df.columns if c != "cell"]]]
        lines += [f"### {stage}: {name}", ""]
        if len(df) > MAX_ROWS:
            where = ", ".join(f"`results/{stage}/{c}/{name}.csv`" for c in df["cell"].unique())
            lines += [f"{len(df)} rows, not copied here: {where} in the run's folder", ""]
        else:
            lines.append(to_markdown(df))
    return lines


def write_record(folder: Path, out: Path) -> Path:
    """The record of the finished run in `folder`, written under `out`; returns its path."""
    name, text = render(results_of(Path(folder)))
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def publish_command(root: Path, check: bool) -> None:
    """--publish: rewrite the marked blocks of README.md and docs/ from docs/results/ (--check: list them)."""
    from steps.record.publish import PublishError, publish  # no MLflow needed: it reads Markdown only

    try:
        changed = publish(root, check=check)
    except PublishError as exc:
        sys.exit(f"python -m steps.record --publish: {exc}")
    for page in changed:
        print(f"{'differs from the records' if check else 'rewritten'}: {page}")
    if check and changed:
        sys.exit(
            "python -m steps.record --publish --check: blocks differ from the records; run "
            "`python -m steps.record --publish` and commit the pages"
        )


def main(argv: list[str] | None = None) -> None:
    ap = cli_parser("python -m steps.record", __doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="?", help="a finished DAG's results/ folder (or the folder holding it)")
    ap.add_argument("--out", type=Path, default=Path("docs/results"), help="where the record goes (docs/results)")
    ap.add_argument("--publish", action="store_true", help="rewrite the record blocks of README and docs/")
    ap.add_argument("--check", action="store_true", help="with --publish: write nothing, fail when a block differs")
    ap.add_argument("--root", type=Path, default=Path("."), help="with --publish: the repository root (.)")
    args = ap.parse_args(argv)
    if args.publish:
        return publish_command(args.root, args.check)
    if args.results is None:
        ap.error("give a finished DAG's results/ folder, or --publish")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file: no progress bar
    try:
        print(write_record(args.results, args.out))
    except RecordError as exc:
        sys.exit(f"python -m steps.record: {exc}")


if __name__ == "__main__":
    main()
