"""`python -m steps.campaign [--rehearse] [--budget S] [--out DIR] [--wheels DIR]` (scripts/gpu-campaign).

--out (the device call's $OUT) gets a few flat files, rewritten after every cell: the ledger
campaign.json (each finished cell's record embedded) and the dated record <date>-<device>-<commit>.md;
the jobs run in a work folder beside it (--work, default a fresh one under $TMPDIR): the device
call brings back at most 8 files, no deeper than $OUT/a/b/file.

Only the standard library is imported before the wheel step: the packages it installs (mlflow,
jsonschema, ...) must be importable by everything after it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from steps.campaign.wheels import install_wheels
from steps.core.cli import parser as cli_parser

ROOT = Path(__file__).resolve().parents[2]
NEEDED = ("yaml", "jsonschema", "mlflow", "pandas", "torch", "tqdm")  # what every cell and this command import
PACKAGES = "scripts/gpu-image-packages.txt"  # the GPU image's packages: HAVE.txt for missing_wheels.sh
CONFIGS = {False: ROOT / "configs" / "gpu-campaign.yaml", True: ROOT / "configs" / "gpu-rehearse.yaml"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = cli_parser("scripts/gpu-campaign", __doc__.split("\n\n")[0])
    ap.add_argument("--rehearse", action="store_true", help="CPU, tiny shapes (configs/gpu-rehearse.yaml)")
    ap.add_argument("--config", type=Path, help="campaign file (default: configs/gpu-campaign.yaml, or -rehearse)")
    ap.add_argument("--budget", type=float, help="seconds for the whole campaign (default: the file's budget_s, 420)")
    ap.add_argument("--out", type=Path, help="ledger and record, flat ($OUT, else results/campaign)")
    ap.add_argument("--work", type=Path, help="where the jobs run (default: a fresh folder under $TMPDIR)")
    ap.add_argument("--wheels", type=Path, help="a folder of wheels to install first (scripts/missing_wheels.sh)")
    ap.add_argument("--site", type=Path, help="where the wheels go (default: $TMPDIR/n00bgpt-campaign-site)")
    ap.add_argument("--groups", nargs="+", metavar="GROUP", help="only these plan groups (e.g. a second call)")
    ap.add_argument("--skip-done", type=Path, metavar="LEDGER", help="carry the cells ok in this earlier campaign.json")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    t0, started = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    command = shlex.join(["scripts/gpu-campaign", *(sys.argv[1:] if argv is None else argv)])
    args = parse(argv)
    out = (args.out or Path(os.environ.get("OUT") or ROOT / "results" / "campaign")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = (args.work or Path(tempfile.mkdtemp(prefix="n00bgpt-campaign-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    # the jobs run in `work`: they import this checkout's `steps` (the GPU image has no editable install)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    site = args.site or Path(os.environ.get("TMPDIR", "/tmp")) / "n00bgpt-campaign-site"
    try:
        wheels = install_wheels(args.wheels, site)
    except (FileNotFoundError, ValueError) as exc:
        print(f"gpu-campaign: {exc}", file=sys.stderr)
        return 2
    print("\n".join(wheels.lines()), flush=True)
    lacking = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if wheels.error or lacking:
        print(f"gpu-campaign: {wheels.error or 'this Python lacks ' + ', '.join(lacking)}", file=sys.stderr)
        print(f"  fix: --wheels DIR from scripts/missing_wheels.sh {PACKAGES} DIR", file=sys.stderr)
        return 2

    from steps.campaign.plan import build_plan, load_campaign
    from steps.campaign.record import environment
    from steps.campaign.rerun import load_done
    from steps.config import ConfigError

    config = args.config or CONFIGS[args.rehearse]
    try:
        settings, lab = load_campaign(config)
        if args.rehearse and lab["device"] != "cpu":
            raise ConfigError(f"{config}: a rehearsal runs on the CPU (device: cpu), got device: {lab['device']}")
        env = environment()
        if lab["device"] == "cuda" and "gpus" not in env and not args.dry_run:
            raise ConfigError(f"{config} asks for CUDA and this machine has none: rehearse with --rehearse")
        # every job writes to the campaign's own store, nested under its lab run
        lab["tracking"]["uri"] = lab["tracking"]["uri"] or f"sqlite:///{work / 'results' / 'mlflow.db'}"
        plan = select_groups(build_plan(lab, settings), args.groups)
        done = load_done(args.skip_done) if args.skip_done else ("", {})
    except (ConfigError, FileNotFoundError) as exc:
        print(f"gpu-campaign: {exc}", file=sys.stderr)
        return 2
    for c in plan:
        print(f"  {c.group:>16}  {c.name}{f'  [skipped: {c.skip}]' if c.skip else ''}")
    if args.dry_run:
        return 0
    facts = {
        "command": command,
        "config": str(config),
        "work": str(work),
        "rehearse": args.rehearse,
        "budget_s": args.budget or settings["budget_s"],
        "started_utc": started,
        "env": env,
        "wheels": wheels.lines() if args.wheels else [],
        "settings": settings,
    }
    return campaign(out, work, lab, plan, settings, facts, t0, done)


def select_groups(plan: list, groups: list[str] | None) -> list:
    if not groups:
        return plan
    from steps.config import ConfigError

    known = {c.group for c in plan}
    if set(groups) - known:
        raise ConfigError(f"--groups {sorted(set(groups) - known)} unknown; the plan's groups: {sorted(known)}")
    return [c for c in plan if c.group in groups]


def refresh(out: Path) -> None:
    """Rewrite the record after a cell; a record that cannot be written now (a cell's odd record)
    must not stop the GPU's campaign: the ledger has it, `python -m steps.campaign.record` later."""
    from steps.campaign.record import write_record

    try:
        write_record(out, out)
    except Exception as exc:  # noqa: BLE001 (any: the record is a convenience, the ledger the data)
        print(f"gpu-campaign: record not rewritten ({type(exc).__name__}: {exc}); the ledger has every cell")


def campaign(out: Path, work: Path, lab: dict, plan: list, settings: dict, facts: dict, t0: float, done: tuple) -> int:
    """Run the plan in `work` under one lab run, then the report; the ledger and the record in
    `out`, the record rewritten after every cell (a kill keeps it). 1 if a job failed."""
    from steps.campaign.record import write_record
    from steps.campaign.rerun import carry_done
    from steps.campaign.run import Ledger, run_plan, run_report
    from steps.tracking import lab as lab_run
    from steps.tracking.mlflow_run import LAB_RUN_ENV
    from steps.tracking.provenance import git_commit

    uri, budget = lab["tracking"]["uri"], facts["budget_s"]
    ledger = Ledger(out, {**facts, "commit": git_commit()}, plan)
    carried = carry_done(plan, done[1], work, ledger, done[0]) if done[1] else []
    if carried:
        print(f"carried from {done[0]} (ok there): {', '.join(carried)}")
    (work / "results").mkdir(exist_ok=True)
    os.environ[LAB_RUN_ENV] = lab_run.start(uri, lab, facts["command"])  # creates the store before any job
    record = write_record(out, out)
    attempted = run_plan(work, lab, plan, settings, budget - (time.monotonic() - t0), ledger, lambda: refresh(out))
    run_report(work, lab, attempted, ledger, settings["report_reserve_s"])
    statuses = [e["status"] for e in ledger.data["cells"].values()] + [ledger.data["report"]["status"]]
    failed = statuses.count("failed")
    lab_run.close(uri, os.environ[LAB_RUN_ENV], "FAILED" if failed else "FINISHED")
    ledger.data["wall_s"] = round(time.monotonic() - t0, 1)
    ledger.save()
    refresh(out)
    report = work / "results" / "reports" / "index.md"
    if report.exists():  # the report's Markdown beside the record (its plots stay in the work folder)
        shutil.copyfile(report, out / "report.md")
    print(f"record: {record}\nledger: {ledger.path}\nreport: {work / 'results' / 'reports' / 'index.md'}")
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("ok", "skipped", "failed", "timeout", "not run"))
    print(f"wall {ledger.data['wall_s']:.0f} s of a {budget:.0f} s budget; cells: {counts}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
