"""The dated results record, `docs/results/<date>-<device>-<commit>.md`: where it ran (device,
driver, versions), the exact command, the perf ladder table (tokens/s median p10/p90, × baseline
with its 95 % interval, MFU against the measured and the published peak, peak memory), every
other cell's key numbers (its stage's report columns), and each planned cell that did not run,
with why.

It reads the cells' own records (results/<stage>/<cell>/metrics.json, failed.json: what the
report reads too) and, when there is one, the campaign's ledger (campaign.json), whose embedded
records are enough alone: the campaign's --out folder as the device call brings it back, also from
a campaign killed mid-run (its record then says which cell was running). Without a ledger
(a Snakemake DAG's folder, e.g. the smoke DAG) it takes the command and commit from the MLflow
lab run and the environment from this machine, and says so.

    python -m steps.campaign.record DIR [--to DOCS_DIR]
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path

import pandas as pd

from steps.campaign.plan import SETTINGS
from steps.core.cli import parser as cli_parser
from steps.presentation.perf import SHOWN as PERF
from steps.tables import fmt, to_markdown
from steps.tracking.provenance import cpu_model, git_commit, package_versions

VERSIONS = ("triton", "numba", "numba-cuda", "cupy", "jaxlib")


def environment() -> dict:
    """This machine: device, driver, CUDA, and the versions of what the cells import."""
    import torch

    env = {"host": platform.node(), "cpu": cpu_model(), "versions": package_versions()}
    for name in VERSIONS:
        try:
            env["versions"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env |= {
            "device": torch.cuda.get_device_name(0),
            "device_memory_gib": round(props.total_memory / 2**30, 1),
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "driver": nvidia_smi("driver_version"),
            "gpus": torch.cuda.device_count(),
        }
    else:
        env |= {"device": f"CPU: {env['cpu']}", "driver": "none (no CUDA device)", "cuda": torch.version.cuda}
    return env


def nvidia_smi(field: str) -> str:
    if not shutil.which("nvidia-smi"):
        return "unknown (no nvidia-smi)"
    proc = subprocess.run(
        ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    )
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else "unknown"


def slug(text: str, n: int = 32) -> str:
    """A file-name part: lower case, runs of other characters a dash, trademark marks dropped
    ("Intel(R) Xeon(R) Processor" -> intel-xeon-processor)."""
    text = re.sub(r"\((r|tm|c)\)", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:n].strip("-") or "unknown"


def record_name(facts: dict) -> str:
    """<date>-<device>-<commit>.md (date of the campaign's start, UTC)."""
    device = facts["env"]["device"]
    device = "cpu" if device.startswith("CPU") else device.removeprefix("NVIDIA ")
    commit = facts.get("commit", "unknown")
    dirty = "-dirty" if commit.endswith("-dirty") else ""
    return f"{facts['started_utc'][:10]}-{slug(device)}-{commit.split('-')[0][:10]}{dirty}.md"


def cell_records(out: Path, facts: dict | None = None) -> dict[str, dict]:
    """{"<stage>/<cell>": the job's record} from every metrics.json / failed.json under results/,
    then the records the ledger embeds (a campaign's --out holds no results/)."""
    recs = {}
    for path in sorted((out / "results").glob("*/*/failed.json")) + sorted((out / "results").glob("*/*/metrics.json")):
        rec = json.loads(path.read_text())
        if path.name == "failed.json":
            rec = {**rec, "status": "failed", "reason": rec.get("error", "")}
        stage, cell = path.parent.parent.name, path.parent.name
        if stage != "reports":
            recs[f"{stage}/{cell}"] = rec  # metrics.json (read last) wins over a stale failed.json
    for name, e in ((facts or {}).get("cells") or {}).items():
        if e.get("record"):
            rec = e["record"]
            recs[name] = {**rec, "reason": rec.get("error", "")} if rec.get("status") == "failed" else rec
    return recs


def lab_run_facts(out: Path) -> dict:
    """The command and commit of the last lab run in the folder's MLflow store (a DAG's folder)."""
    db = out / "results" / "mlflow.db"
    if not db.exists():
        return {}
    from steps.tracking import store

    c = store.client(f"sqlite:///{db.resolve()}")
    exp = c.get_experiment_by_name(f"{store.EXPERIMENT_PREFIX}/lab")
    runs = c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1) if exp else []
    if not runs:
        return {}
    tags, start = runs[0].data.tags, runs[0].info.start_time / 1000
    return {
        "command": tags.get("command", ""),
        "commit": tags.get("git_commit", ""),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
    }


def facts_of(out: Path) -> dict:
    """The ledger's facts, or (no ledger) the lab run's + this machine's, marked as such."""
    ledger = out / "campaign.json"
    if ledger.exists():
        return json.loads(ledger.read_text())
    facts = {
        "command": "(unknown)",
        "commit": git_commit(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{k: v for k, v in lab_run_facts(out).items() if v},
    }
    note = "no campaign.json: a Snakemake DAG's folder; environment probed when this record was written"
    return {**facts, "env": environment(), "note": note, "cells": {}}


# record column -> the perf job's metrics.json key: the perf report's own columns (one declaration)
LADDER = {
    **{c: PERF.columns[c] for c in ("tokens/s", "p10", "p90", "× baseline", "low", "high")},
    "MFU (measured peak)": PERF.columns["MFU"],
    **{c: PERF.columns[c] for c in ("MFU (published peak)", "peak memory (MiB)")},
    "loss drift": PERF.columns["drift"],
}


def value(rec: dict, ref: str):
    kind, _, key = ref.partition(".")
    return (rec.get(kind) or {}).get(key)


def ladder_order(rec: dict) -> tuple:
    """Ladder cells by shape: baseline, cumulative rungs in order, single changes (desc as
    steps/config/ladder.py writes it); then the hand-written cells."""
    desc = value(rec, "info.desc") or ""
    m = re.match(r"(\w+): (?:baseline \(ladder step 0\)|ladder step (\d+),|.*\(single change\)$)", desc)
    if not m:  # the section's baseline cell first
        return (1, "", 0 if rec["cell"] == (value(rec, "info.params") or {}).get("baseline_cell") else 1, 0)
    kind = 0 if desc.endswith("(ladder step 0)") else (1 if m.group(2) else 2)
    return (0, m.group(1), kind, int(m.group(2) or 0))


def perf_table(recs: dict[str, dict]) -> pd.DataFrame:
    rows = []
    for name, rec in sorted(recs.items(), key=lambda kv: ladder_order(kv[1])):
        if not name.startswith("perf/") or rec.get("status") != "ok":
            continue
        row = {"cell": name.removeprefix("perf/"), "what": value(rec, "info.desc")}
        row |= {col: value(rec, ref) for col, ref in LADDER.items()}
        ratio, low, high = row.pop("× baseline"), row.pop("low"), row.pop("high")
        row["× baseline [95 %]"] = f"{fmt(ratio, 3)} [{fmt(low, 3)}, {fmt(high, 3)}]" if ratio is not None else ""
        row["published peak"] = value(rec, "info.published_peak")
        rows.append(row)
    cols = ["cell", "what", "tokens/s", "p10", "p90", "× baseline [95 %]", "MFU (measured peak)"]
    cols += ["MFU (published peak)", "published peak", "peak memory (MiB)", "loss drift"]
    return pd.DataFrame(rows, columns=cols)


def stage_table(stage: str, recs: dict[str, dict]) -> pd.DataFrame:
    """A non-perf stage's ok cells with its report columns (metrics.* and info.*)."""
    from steps.core.stage import presentation

    columns = {t: r for t, r in presentation(stage).columns.items() if not r.startswith("params.")}
    rows = [
        {"cell": n.split("/", 1)[1], **{t: value(rec, r) for t, r in columns.items()}}
        for n, rec in recs.items()
        if n.startswith(f"{stage}/") and rec.get("status") == "ok"
    ]
    return pd.DataFrame(rows).dropna(axis=1, how="all") if rows else pd.DataFrame()


def judged(low: float | None, high: float | None, target: float) -> str:
    """met / not met where the interval decides it, else not decided."""
    if low is None or high is None:
        return "not decided (no interval)"
    return "met" if low >= target else "not met" if high < target else "not decided"


def headline(facts: dict, recs: dict[str, dict]) -> list[str]:
    """The first ladder shape's leading rung (the campaign's `headline`, else its last cumulative
    rung that finished) against the targets: × baseline by its 95 % interval, MFU against the
    published peak by the timed steps' p10-p90 (MFU is tokens/s times a constant)."""
    settings = facts.get("settings") or {}
    targets = {**SETTINGS["targets"], **(settings.get("targets") or {})}  # a ledger older than the key: defaults
    rungs = sorted(
        (r for n, r in recs.items() if n.startswith("perf/") and r.get("status") == "ok"),
        key=ladder_order,
    )
    rungs = [r for r in rungs if ladder_order(r)[:1] == (0,) and ladder_order(r)[2] == 1]
    if not rungs:
        return ["No cumulative ladder rung finished: no headline."]
    shape = ladder_order(rungs[0])[1]
    rungs = [r for r in rungs if ladder_order(r)[1] == shape]
    named = [r for r in rungs if settings.get("headline") and r["cell"] == f"{shape}_ladder_{settings['headline']}"]
    rec = (named or rungs)[-1]
    ratio, low, high = (value(rec, PERF.columns[c]) for c in ("× baseline", "low", "high"))
    tps, p10, p90 = (value(rec, PERF.columns[c]) for c in ("tokens/s", "p10", "p90"))
    mfu = value(rec, PERF.columns["MFU (published peak)"])
    mfu_lo, mfu_hi = (mfu * q / tps if mfu is not None and tps and q else None for q in (p10, p90))
    x_target, m_target = targets["x_baseline"], targets["mfu_published"]
    rows = [
        {
            "target": f"× the fp32 eager baseline ≥ {fmt(x_target, 3)}",
            "measured": f"{fmt(ratio, 3)} [{fmt(low, 3)}, {fmt(high, 3)}] (95 %)",
            "verdict": judged(low, high, x_target),
        },
        {
            "target": f"MFU against the published dense peak ({value(rec, 'info.published_peak')}) ≥ {m_target:.0%}",
            "measured": f"{mfu:.1%} [{mfu_lo:.1%}, {mfu_hi:.1%}] (p10-p90 of the steps)" if mfu_lo else str(mfu),
            "verdict": judged(mfu_lo, mfu_hi, m_target),
        },
    ]
    what = value(rec, "info.desc") or rec["cell"]
    return [f"`perf/{rec['cell']}` ({what}); tokens/s {fmt(tps, 4)}.", "", to_markdown(pd.DataFrame(rows))]


def not_run(facts: dict, recs: dict[str, dict]) -> pd.DataFrame:
    """Every planned (ledger) or recorded cell that did not finish ok, with its reason."""
    rows = {n: (r["status"], r.get("reason", "")) for n, r in recs.items() if r["status"] != "ok"}
    for name, e in (facts.get("cells") or {}).items():  # the ledger knows timeouts and what never started
        if e.get("status") == "running":
            rows[name] = ("stopped", "running when the campaign was killed (the device call's limit?)")
        elif e.get("status") == "planned":
            rows[name] = ("not run", "the campaign stopped before it finished")
        elif e.get("status") != "ok":
            rows[name] = (e["status"], e.get("reason", ""))
    rows = [{"cell": n, "status": st, "reason": str(why).removeprefix("skipped: ")} for n, (st, why) in rows.items()]
    df = pd.DataFrame(rows, columns=["cell", "status", "reason"])
    df["reason"] = df["reason"].astype(str).str.split("\n").str[0].str[:200]
    return df


def gpu_facts(env: dict) -> str:
    return f" ({env['device_memory_gib']} GiB, compute capability {env['compute_capability']})" if "gpus" in env else ""


def render(out: Path, commit: str | None = None) -> tuple[str, str]:
    """(file name, Markdown) of the record of the campaign (or DAG) folder `out`; `commit` names
    the commit that ran where the ledger's is a device copy's (its note says which it named)."""
    facts = facts_of(out)
    if commit and commit != facts.get("commit"):
        said = f"the ledger named {facts.get('commit')} (the device copy's .git); the tree that ran was {commit}"
        facts = {**facts, "commit": commit, "note": "; ".join(filter(None, [facts.get("note"), said]))}
    recs = cell_records(out, facts)
    env = facts["env"]
    versions = ", ".join(f"{k} {v}" for k, v in sorted(env.get("versions", {}).items()))
    lines = [
        f"# Results record: {facts['started_utc'][:10]}, {env['device']}, commit {facts.get('commit', 'unknown')}",
        "",
        f"- **device**: {env['device']}{gpu_facts(env)}",
        f"- **driver**: {env.get('driver')}; CUDA (torch build): {env.get('cuda')}",
        f"- **host**: {env.get('host')}, CPU {env.get('cpu')}",
        f"- **versions**: {versions}",
        f"- **command**: `{facts.get('command')}`",
        f"- **started**: {facts['started_utc']}"
        + (f"; wall {facts['wall_s']:.0f} s of a {facts['budget_s']:.0f} s budget" if "wall_s" in facts else ""),
    ]
    if facts.get("rehearse"):
        lines.append("- **rehearsal**: CPU, tiny shapes; the numbers exercise the pipeline, they say nothing of a GPU")
    carried = sorted({e["carried"] for e in (facts.get("cells") or {}).values() if e.get("carried")})
    if carried:
        lines.append(f"- **carried** (ok in an earlier call, --skip-done): from {'; '.join(carried)}")
    if facts.get("note"):
        lines.append(f"- **note**: {facts['note']}")
    if facts.get("wheels"):  # the summary line; campaign.json lists every wheel
        lines.append(f"- **wheels**: {facts['wheels'][0]}")
    lines += ["", "## Headline: the targets", ""]
    lines += headline(facts, recs)
    lines += ["", "## Perf ladder and table", ""]
    table = perf_table(recs)
    lines.append(to_markdown(table, 4) if not table.empty else "No perf cell finished.\n")
    lines.append(
        "tokens/s: median over the timed steps (p10/p90 beside it); × baseline: geometric mean over the steps "
        "interleaved with the shape's baseline, 95 % interval; MFU: model FLOPs (6N + 12·L·d·T) over the "
        "GEMM peak measured in the job, and over the published dense peak named beside it.\n"
    )
    for stage in dict.fromkeys(n.split("/")[0] for n in recs if not n.startswith("perf/")):
        df = stage_table(stage, recs)
        if not df.empty:
            lines += [f"## {stage}", "", to_markdown(df, 4)]
    skipped = not_run(facts, recs)
    lines += ["## Cells skipped or not run", ""]
    lines.append(to_markdown(skipped) if not skipped.empty else "None: every planned cell finished.\n")
    lines += log_tails(facts)
    return record_name(facts), "\n".join(lines)


def log_tails(facts: dict, n: int = 15) -> list[str]:
    """The end of each failed or stopped job's log, from the ledger: what broke, readable from
    the device call's $OUT alone (the logs stay on the machine)."""
    tails = [(name, e["log_tail"]) for name, e in (facts.get("cells") or {}).items() if e.get("log_tail")]
    out = ["## Log tails of the cells that did not finish ok", ""] if tails else []
    for name, text in tails:
        out += [f"`{name}`:", "", "```", *text.splitlines()[-n:], "```", ""]
    return out


def write_record(out: Path, to: Path | None = None, commit: str | None = None) -> Path:
    """Write the record under `to` (default: `out`/docs/results); returns its path."""
    name, text = render(Path(out), commit)
    dest = Path(to) if to else Path(out) / "docs" / "results"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / name).write_text(text)
    return dest / name


def main(argv: list[str] | None = None) -> None:
    ap = cli_parser("python -m steps.campaign.record", __doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a campaign's --out folder, or a DAG's working folder")
    ap.add_argument("--to", type=Path, help="where the record goes (default FOLDER/docs/results)")
    ap.add_argument(
        "--commit",
        help="the commit the device ran (a ledger written before N00BGPT_GIT_COMMIT named its device copy's .git)",
    )
    args = ap.parse_args(argv)
    if not (args.folder / "results").is_dir() and not (args.folder / "campaign.json").exists():
        ap.error(f"{args.folder}: no campaign.json or results/ (give a campaign's --out or a DAG's working folder)")
    print(write_record(args.folder, args.to, args.commit))


if __name__ == "__main__":
    main()
