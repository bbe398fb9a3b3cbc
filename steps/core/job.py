"""One job's life: parse its command line, open its MLflow run, seed, call the stage's `run`, and
write metrics.json (or failed.json). metrics.json names the run id: it is how the report knows
which runs belong to this DAG. Every failure ends the run FAILED; a SkipCell ends it skipped."""

from __future__ import annotations

import json
import math
import signal
import sys
import time
import traceback
from pathlib import Path

from steps import lifeline
from steps.config import ConfigError
from steps.core.cli import parse_args
from steps.core.errors import InputError, SkipCell
from steps.core.run import StageRun
from steps.core.runcache import JobCache
from steps.core.seeds import METHOD, aggregate
from steps.tracking.describe import cell_note, stage_description
from steps.tracking.mlflow_run import MlflowRun
from steps.tracking.provenance import is_number
from steps.tracking.server import unreachable


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    tmp.replace(path)  # atomic: a killed job never leaves a half-written metrics.json


def split_metrics(metrics: dict) -> tuple[dict, dict]:
    """`run`'s result: numbers go to metrics (NaN -> null), everything else to info."""
    numbers, info = {}, {}
    for k, v in (metrics or {}).items():
        if is_number(v):
            numbers[k] = None if isinstance(v, float) and math.isnan(v) else float(v)
        else:
            info[k] = v
    return numbers, info


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the run's ending short
    raise SystemExit(f"killed by signal {signum}")


def _end_failed(ctx: StageRun, message: str) -> str | None:
    """End the job's run FAILED. If its tracking server is gone, the line that says so (the run
    stays RUNNING; the next job of its cell closes it, mlflow_run.py) rather than a traceback."""
    try:
        ctx.end("failed", message)
    except Exception as exc:
        lost = unreachable(exc, ctx.uri)
        if lost is None:
            raise
        return lost
    return None


def _killed(ctx: StageRun, record: dict, failed_file: Path, why: str) -> None:
    """The job's ending when its snakemake is gone (steps/lifeline.py runs it from its own thread, the
    main one may be deep in a step): failed.json says why, then the run ends FAILED."""
    message = f"killed: {why}"
    _write_json(
        failed_file,
        {**record, "status": "failed", "run_id": ctx.run_id, "experiment_id": ctx.experiment_id, "error": message},
    )
    _end_failed(ctx, message)


def seed_count(stage, params: dict) -> int:
    """How many seeds the cell trains: its `seeds` knob (every stage section has one, a cell may
    override it). A stage that trains its seeds itself (word2vec: the further seeds only train and
    score, steps/word2vec/seeds.py) declares `own_seeds` and gets 1 here."""
    if getattr(stage, "own_seeds", False):
        return 1
    return max(1, int(params.get("seeds") or 1))


def seed_group(stage, ctx: StageRun, first: dict, seeds: int) -> dict:
    """Run the cell's further seeds (seed+1 .. seed+seeds-1), each in its own MLflow run nested under
    the cell's and its own folder (`<out>/seeds/<seed>/`); the first seed ran in the cell's own run
    and folder (its files, curves and model are the cell's). Returns the cell's metrics: every
    number's mean over the seeds with its sd and 95 % interval (steps/core/seeds.py), `seeds`; each
    seed's outcomes are a row of the cell's `seeds` table."""
    per_seed = [(ctx.seed, first)]
    for i in range(1, seeds):
        seed = ctx.seed + i
        twin = ctx.for_seed(seed, ctx.mlflow.seed_run(seed))
        print(f"{ctx.stage}[{ctx.cell}] seed {seed} ({i + 1} of {seeds})", file=sys.stderr)
        twin.start()
        try:
            twin.seed_everything()
            numbers, _ = split_metrics(stage.run(twin) or {})
            twin.log_metrics({k: v for k, v in numbers.items() if v is not None})
        except BaseException as exc:
            twin.end("failed", f"{type(exc).__name__}: {exc}")
            raise
        twin.end("ok")
        per_seed.append((seed, numbers))
    ctx.seed_everything()  # what the job does after its seeds sees the first seed's state again
    # the first seed's own run, nested like the others (its curves and files are on the cell's run)
    ctx.log_child(
        f"{ctx.stage}:{ctx.cell} seed {ctx.seed}",
        params={"seed": ctx.seed},
        metrics={k: v for k, v in first.items() if v is not None},
        tags={"seed": str(ctx.seed), "seed_of": str(ctx.run_id), "first_seed": "its curves and files: the cell run's"},
    )
    group = aggregate([m for _, m in per_seed])
    spread = [k for k in group if k.endswith("_sd")]
    table = [{"seed": s, **{k.removesuffix("_sd"): m.get(k.removesuffix("_sd")) for k in spread}} for s, m in per_seed]
    write_seed_table(ctx, table)
    ctx.info["seeds"] = ", ".join(str(s) for s, _ in per_seed)
    ctx.info["seed_interval"] = METHOD
    return group


def write_seed_table(ctx: StageRun, rows: list[dict]) -> None:
    """`<out>/seeds.csv` (+ .md): one row per seed, the outcomes that differ between seeds."""
    import csv

    from steps.tables import fmt

    path = ctx.out / "seeds.csv"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    md = ["| " + " | ".join(keys) + " |", "|" + "|".join("---" for _ in keys) + "|"]
    md += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    path.with_suffix(".md").write_text("\n".join(md) + "\n")
    ctx.log_artifact(path, "tables")
    ctx.log_artifact(path.with_suffix(".md"), "tables")


def run_job(stage, argv: list[str] | None = None) -> None:
    """Entry point of `python -m steps.<stage>` (`Stage.main`): `stage` is a steps.core.stage.Stage, read only
    (its name, module, run and presentation); the contract imports the runner, never the other way round."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    lifeline.die_with_snakemake()  # a job never outlives the snakemake that started it
    name = stage.name
    args = parse_args(f"python -m {stage.module}", argv)
    # the run cache's key, before the job runs: its code and inputs as they are now (steps/core/runcache.py)
    cached = JobCache.of(name, args.cfg, args.inputs, args.outputs) if args.mlflow else None
    common, params = args.cfg.get("common", {}), args.cfg.get("params", {})
    cell = args.cfg.get("cell", "main")
    about = {
        "module": stage.module,
        "description": stage_description(stage.module, dict(stage.columns), stage.headline),
        "note": cell_note(name, cell, args.cfg.get("overrides"), params),
        "params_shown": stage.params_used(params) if stage.params_used else params,
        "system_metrics": stage.system_metrics,
        "sweep": args.cfg.get("sweep"),  # a sweep's cell: its runs' tags (steps/config/sweep.py)
    }
    uri = (common.get("tracking") or {}).get("uri")

    def open_run(config_hash: str, seed: int) -> MlflowRun:
        return MlflowRun(uri, name, cell, config_hash, seed, enabled=args.mlflow)

    ctx = StageRun(
        name,
        cell,
        params,
        common,
        args.out,
        open_run,
        inputs=args.inputs,
        outputs=args.outputs,
        about=about,
    )
    metrics_file = Path(args.outputs["metrics"])
    failed_file = metrics_file.with_name("failed.json")
    t0 = time.time()
    record = {"stage": name, "cell": ctx.cell, "config_hash": ctx.config_hash, "tracking_uri": ctx.uri}
    lifeline.on_death(lambda why: _killed(ctx, record, failed_file, why))  # snakemake gone: end now, no metrics.json
    try:
        ctx.start()
        ctx.seed_everything()
        result = stage.run(ctx) or {}
        numbers, info = split_metrics(result)
        seeds = seed_count(stage, params)
        if seeds > 1:  # the cell's outcomes: means over its seeds, with their intervals
            numbers = seed_group(stage, ctx, numbers, seeds)
        numbers["wall_time_s"] = round(time.time() - t0, 3)
        # a seed group's means at the run's last step: MLflow shows a metric's value at its highest step
        last = ctx.mlflow.last_step if seeds > 1 else None
        ctx.log_metrics({k: v for k, v in numbers.items() if v is not None}, step=last)
        info.update(ctx.info)
        record.update(status="ok", run_id=ctx.run_id, experiment_id=ctx.experiment_id, metrics=numbers, info=info)
        ctx.end("ok")
    except SkipCell as exc:
        record.update(
            status="skipped",
            reason=str(exc),
            run_id=ctx.run_id,
            experiment_id=ctx.experiment_id,
            metrics={},
            info=dict(ctx.info),
        )
        ctx.end("skipped", str(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure must end the run FAILED
        lost = unreachable(exc, ctx.uri)  # the tracking server is gone: one line, no run left to end
        expected = lost or isinstance(exc, (InputError, ConfigError, FileNotFoundError, SystemExit, KeyboardInterrupt))
        message = lost or f"{type(exc).__name__}: {exc}"
        try:
            lost = lost or _end_failed(ctx, message)
        finally:
            _write_json(
                failed_file,
                {
                    **record,
                    "status": "failed",
                    "run_id": ctx.run_id,
                    "experiment_id": ctx.experiment_id,
                    "error": message,
                },
            )
        if not expected:
            traceback.print_exc()
        print(f"\n{name}[{ctx.cell}] failed: {message}", file=sys.stderr)
        if lost and lost != message:
            print(f"{name}[{ctx.cell}]: {lost}", file=sys.stderr)
        sys.exit(1)
    failed_file.unlink(missing_ok=True)
    with lifeline.finishing():  # never once snakemake is gone: the lifeline ends the job instead
        _write_json(metrics_file, record)
    print(f"{name}[{ctx.cell}] {record['status']}: run {ctx.run_id} -> {metrics_file}", file=sys.stderr)
    if cached is not None:  # ok or skipped: kept for the next time this job comes (never fails it)
        cached.save(record)
