"""The GPU campaign (steps/campaign, scripts/gpu-campaign) without a GPU: the wheel step against
a local wheel folder, the plan's order, the budget stopping a run cleanly (a job killed at its
timeout, the rest recorded as not run), the record writer on a finished smoke store, and the whole
rehearsal end to end on the CPU (real stage jobs, real MLflow store, the report, the record)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steps.campaign import plan as campaign_plan
from steps.campaign.record import headline, judged, write_record
from steps.campaign.rerun import carry_done, load_done
from steps.campaign.run import Ledger, run_plan
from steps.campaign.wheels import install_wheels
from steps.config import ConfigError
from steps.tables import fmt
from steps.tracking import store
from tests.conftest import ROOT, clean_env, mlflow_runs

REHEARSE = ROOT / "configs" / "gpu-rehearse.yaml"
RECORD = [sys.executable, "-m", "steps.campaign.record"]


def make_wheel(tmp: Path, name: str, version: str, folder: Path) -> Path:
    """A pure-Python package `name` (its module says its version), built with `pip wheel`."""
    src = tmp / f"src-{name}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (src / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--no-build-isolation"]
    subprocess.run([*cmd, "-w", str(folder), str(src)], check=True, capture_output=True, timeout=300)
    return next(folder.glob(f"{name}-{version}-*.whl"))


@pytest.fixture
def isolated_path(monkeypatch):
    """install_wheels extends sys.path and PYTHONPATH: restore both after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


def test_wheel_step_installs_what_is_missing_and_skips_the_rest(tmp_path, isolated_path):
    wheels = tmp_path / "wheels"
    make_wheel(tmp_path, "campaign_probe_pkg", "0.3.1", wheels)
    make_wheel(tmp_path, "tqdm", "0.0.1", wheels)  # the real tqdm is installed: never replaced
    site = tmp_path / "site"

    report = install_wheels(wheels, site)
    assert report.error == ""
    assert report.installed == ["campaign-probe-pkg==0.3.1"]
    assert len(report.skipped) == 1 and report.skipped[0].startswith("tqdm==0.0.1 (have ")
    assert not list(site.glob("tqdm*"))
    # this process and a child (PYTHONPATH) import the installed package
    import campaign_probe_pkg

    assert campaign_probe_pkg.VERSION == "0.3.1" and Path(campaign_probe_pkg.__file__).is_relative_to(site)
    child = subprocess.run(
        [sys.executable, "-c", "import campaign_probe_pkg as m; print(m.VERSION)"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        cwd=tmp_path,
    )
    assert child.stdout.strip() == "0.3.1", child.stderr
    # a second call finds it installed
    again = install_wheels(wheels, site)
    assert again.installed == [] and any(s.startswith("campaign-probe-pkg==0.3.1 (have 0.3.1)") for s in again.skipped)


def test_wheel_step_says_which_folder_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing_wheels.sh"):
        install_wheels(tmp_path / "nope", tmp_path / "site")


def test_plan_puts_baseline_and_last_rung_first():
    settings, lab = campaign_plan.load_campaign(ROOT / "configs" / "gpu-campaign.yaml")
    cells = campaign_plan.build_plan(lab, settings)
    names = [c.name for c in cells]
    # the speed stack the campaign's `headline` names leads (the last rung adds memory trades)
    assert names[:2] == ["perf/t1024_baseline", "perf/t1024_ladder_fused_adamw"]
    assert names.index("perf/t1024_ladder_fp8") > names.index("minitorch/ops_cuda")  # the rest: later
    # then one pass over every target before the rest of the ladders (a 7-minute first call)
    order = ["gpt_parity/gpt2_shape", "perf/baseline", "gpt_train/main", "inference/kv_cache", "perf/fused_triton"]
    order += ["components/main", "minitorch/ops_cuda", "perf/t1024_ladder_bf16", "perf/t1024_tf32"]
    order += ["perf/t128_baseline"]
    assert [names.index(n) for n in order] == sorted(names.index(n) for n in order)
    assert names.index("perf/attn_manual") < names.index("perf/fused_triton")  # its baseline, in its group
    assert cells[1].after == ["perf/t1024_baseline"]
    assert cells[1].inputs["baseline"] == "results/perf/t1024_baseline/metrics.json"
    assert not any(c.skip for c in cells if c.stage == "perf")  # on CUDA every perf cell runs
    # on the CPU the lead rung is the last one the CPU can run; CUDA-only cells carry the stage's reason
    settings, lab = campaign_plan.load_campaign(REHEARSE)
    cells = {c.name: c for c in campaign_plan.build_plan(lab, settings)}
    assert list(cells)[:2] == ["perf/t32_baseline", "perf/t32_ladder_fused_ce"]
    assert cells["perf/t32_ladder_cuda_graphs"].skip.startswith("needs CUDA")
    assert cells["perf/tf32"].skip.startswith("needs CUDA") and cells["components/main"].skip.startswith("needs CUDA")


def test_a_missing_package_skips_its_cells(monkeypatch):
    """A stage whose package the image lacks (and no wheel brought) is skipped, saying which."""
    monkeypatch.setitem(campaign_plan.REQUIRES, "prepare_corpus", ("no-such-dist-xyz",))
    settings, lab = campaign_plan.load_campaign(REHEARSE)
    cells = {c.name: c for c in campaign_plan.build_plan(lab, settings)}
    assert cells["prepare_corpus/main"].skip == "needs no-such-dist-xyz (not installed here, and no wheel brought it)"
    assert cells["gpt_train/main"].after == ["prepare_corpus/main", "train_tokenizer/main"]  # run_plan: not run
    assert not cells["gpt_parity/odd"].skip


BUDGET = 25  # seconds: the first job is past its imports and training (timed_steps 100,000) when stopped


@pytest.mark.slow
def test_budget_stops_the_run_cleanly(tmp_path):
    """A budget that runs out inside the first cell: that job is stopped at its timeout (it ends
    its MLflow run FAILED), every later cell is recorded as not run, and the record lists them."""
    uri = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    store.init(uri)  # as the campaign does (its lab run) before any job: a killed job never half-creates it
    over = {"perf": {"timed_steps": 100_000}, "tracking": {"uri": uri}}
    settings, lab = campaign_plan.load_campaign(REHEARSE, overrides=over)
    settings |= {"report_reserve_s": 0, "min_cell_s": 5}
    cells = campaign_plan.build_plan(lab, settings)
    facts = {"command": "test", "budget_s": BUDGET, "started_utc": "2026-01-02T00:00:00Z", "commit": "abc123"}
    facts["env"] = {"device": "CPU: test", "versions": {}}
    ledger = Ledger(tmp_path, facts, cells)
    t0 = time.monotonic()
    attempted = run_plan(tmp_path, lab, cells, settings, BUDGET, ledger)
    assert time.monotonic() - t0 < BUDGET + 20  # the timeout, then SIGTERM's grace at most
    status = {n: e["status"] for n, e in ledger.data["cells"].items()}
    assert [c.name for c in attempted] == ["perf/t32_baseline"]
    assert status["perf/t32_baseline"] == "timeout"
    assert status["perf/t32_ladder_fused_ce"] == "not run"
    assert ledger.data["cells"]["gpt_train/main"]["reason"].startswith("budget spent")
    assert status["perf/tf32"] == "skipped"
    failed = json.loads((tmp_path / "results/perf/t32_baseline/failed.json").read_text())
    assert "killed by signal" in failed["error"]
    # the ledger carries what the work folder has: the job's record and its log's tail
    entry = ledger.data["cells"]["perf/t32_baseline"]
    assert entry["record"]["error"] == failed["error"] and entry["log_tail"].strip()
    runs = mlflow_runs(tmp_path)
    assert set(runs["status"]) == {"FAILED"}  # the stopped job's run, not left RUNNING
    text = write_record(tmp_path).read_text()
    assert re.search(r"\| perf/t32_baseline \| timeout \| stopped at its \d+ s timeout", text)
    assert "| gpt_train/main | not run | budget spent" in text
    assert "| perf/tf32 | skipped | needs CUDA" in text


@pytest.mark.slow
def test_record_writer_on_a_finished_smoke_store(smoke_dag, tmp_path):
    path = write_record(smoke_dag, tmp_path)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-cpu-[0-9a-f]{10}(-dirty)?\.md", path.name)
    text = path.read_text()
    base = json.loads((smoke_dag / "results/perf/baseline/metrics.json").read_text())
    assert base["status"] == "ok"
    row = next(line for line in text.splitlines() if line.startswith("| baseline |"))
    m = base["metrics"]
    assert f"{fmt(m['speedup'], 3)} [{fmt(m['speedup_low'], 3)}, {fmt(m['speedup_high'], 3)}]" in row
    assert f"| {fmt(m['tokens_per_s'])} | {fmt(m['tokens_per_s_p10'])} | {fmt(m['tokens_per_s_p90'])} |" in row
    assert "no campaign.json" in text and "snakemake" in text  # the lab run's command
    assert "| perf/tf32 | skipped | needs CUDA" in text
    for stage in ("gpt_parity", "gpt_train"):
        assert f"## {stage}" in text


@pytest.mark.slow
@pytest.mark.live
def test_rehearsal_end_to_end(tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(tmp_path, "campaign_probe_pkg", "1.0", wheels)
    out, work = tmp_path / "out", tmp_path / "work"
    cmd = [str(ROOT / "scripts" / "gpu-campaign"), "--rehearse", "--out", str(out), "--wheels", str(wheels)]
    cmd += ["--site", str(tmp_path / "site"), "--work", str(work)]
    env = {**clean_env(), "PYTHON": sys.executable}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "installed campaign-probe-pkg==1.0" in proc.stdout
    ledger = json.loads((out / "campaign.json").read_text())
    assert ledger["rehearse"] and wall < ledger["budget_s"] + 60, wall
    cells = ledger["cells"]
    for name in ("perf/t32_baseline", "perf/t32_ladder_fused_ce", "gpt_parity/odd", "gpt_train/main"):
        assert cells[name]["status"] == "ok", (name, cells[name])
    for name in ("perf/t32_ladder_cuda_graphs", "perf/tf32", "perf/amp_fp16", "perf/fused_triton", "components/main"):
        assert cells[name]["status"] == "skipped" and cells[name]["reason"].startswith("needs CUDA"), name
    minitorch = [e for e in cells.values() if e["stage"] == "minitorch"]  # its cuda cells, or a placeholder
    assert minitorch and all(e["status"] == "skipped" for e in minitorch)
    assert all(e["reason"] == "steps.minitorch not present" or e["reason"].startswith("needs CUDA") for e in minitorch)
    assert ledger["report"]["status"] == "ok" and (work / "results/reports/index.md").exists()
    # what a device call brings back (at most 8 files, flat): the ledger, the record, the report
    (record,) = out.glob("*-cpu-*.md")
    assert sorted(p.name for p in out.iterdir()) == sorted(["campaign.json", "report.md", record.name])
    # the cells' runs in the real MLflow store, nested under the campaign's lab run
    runs = mlflow_runs(work)
    lab = runs[runs["tags.mlflow.runName"].str.startswith("lab run")]
    assert len(lab) == 1 and lab["status"].iloc[0] == "FINISHED"
    children = runs[runs["tags.mlflow.parentRunId"] == lab["run_id"].iloc[0]]
    assert {"perf", "gpt_parity", "gpt_train", "report"} <= set(children["tags.stage"])
    # the record: the ladder rows with the numbers the jobs wrote, and what did not run
    text = record.read_text()
    again = subprocess.run(RECORD + [str(out), "--to", str(tmp_path / "again")], capture_output=True, text=True)
    assert again.returncode == 0 and Path(again.stdout.strip()).read_text() == text, again.stderr
    lead = json.loads((work / "results/perf/t32_ladder_fused_ce/metrics.json").read_text())["metrics"]
    row = next(line for line in text.splitlines() if line.startswith("| t32_ladder_fused_ce |"))
    assert f"{fmt(lead['speedup'], 3)} [{fmt(lead['speedup_low'], 3)}, {fmt(lead['speedup_high'], 3)}]" in row
    assert "scripts/gpu-campaign --rehearse" in text and re.search(r"\| minitorch/\w+ \| skipped \|", text)


def test_skip_done_carries_ok_cells_and_reruns_data_a_rerun_needs(tmp_path):
    """An earlier call's ok cells are carried with their records restored; a data cell ok there
    runs again when a cell that needs it runs (its folder is not in a record)."""
    settings, lab = campaign_plan.load_campaign(REHEARSE)
    plan = campaign_plan.build_plan(lab, settings)
    rec = {"status": "ok", "cell": "t32_baseline", "metrics": {"tokens_per_s": 123.0}}
    first = {"started_utc": "2026-01-02T00:00:00Z", "commit": "abc", "cells": {}}
    first["cells"]["perf/t32_baseline"] = {"status": "ok", "record": rec, "seconds": 9.0}
    first["cells"]["gpt_parity/odd"] = {"status": "failed", "record": {"status": "failed", "error": "boom"}}
    for name in ("prepare_corpus/main", "train_tokenizer/main"):
        first["cells"][name] = {"status": "ok", "record": {"status": "ok"}}
    (tmp_path / "first.json").write_text(json.dumps(first))
    source, done = load_done(tmp_path / "first.json")
    assert source == "2026-01-02T00:00:00Z, commit abc"
    assert set(done) == {"perf/t32_baseline", "prepare_corpus/main", "train_tokenizer/main"}  # ok ones only
    (tmp_path / "out").mkdir()
    ledger = Ledger(tmp_path / "out", {"command": "test"}, plan)
    carried = carry_done(plan, done, tmp_path / "work", ledger, source)
    assert carried == ["perf/t32_baseline"]  # gpt_train/main runs: its corpus and tokenizer run again
    assert json.loads((tmp_path / "work/results/perf/t32_baseline/metrics.json").read_text()) == rec
    entry = ledger.data["cells"]["perf/t32_baseline"]
    assert entry["carried"] == source and entry["status"] == "ok" and entry["record"] == rec
    assert ledger.data["cells"]["gpt_parity/odd"]["status"] == "planned"
    with pytest.raises(ConfigError, match="--skip-done .*campaign.json"):
        load_done(tmp_path / "nope.json")


def test_skip_done_carries_a_cell_only_with_the_config_it_ran(tmp_path):
    """A ladder reordered since the earlier call keeps its cell names for other stacks of changes:
    a record whose params differ from the plan's is run again, not carried."""
    settings, lab = campaign_plan.load_campaign(REHEARSE)
    plan = campaign_plan.build_plan(lab, settings)
    cell = next(c for c in plan if c.name == "perf/t32_baseline")
    same = {"status": "ok", "info": {"params": dict(cell.params)}}
    other = {"status": "ok", "info": {"params": {**cell.params, "batch_size": cell.params["batch_size"] + 1}}}
    (tmp_path / "out").mkdir()
    for record, carried in ((same, ["perf/t32_baseline"]), (other, [])):
        done = {"perf/t32_baseline": {"status": "ok", "record": record}}
        ledger = Ledger(tmp_path / "out", {"command": "test"}, plan)
        assert carry_done(plan, done, tmp_path / "work", ledger, "earlier") == carried


def rung(cell: str, step: int, ratio: tuple, tps: tuple, mfu: float) -> dict:
    m = dict(zip(("speedup", "speedup_low", "speedup_high"), ratio))
    m |= dict(zip(("tokens_per_s_p10", "tokens_per_s", "tokens_per_s_p90"), tps)) | {"mfu_published": mfu}
    desc = f"t9: ladder step {step}, + x" if step else "t9: baseline (ladder step 0)"
    return {"status": "ok", "cell": cell, "metrics": m, "info": {"desc": desc, "published_peak": "X SXM"}}


def test_record_headline_judges_the_targets_by_their_intervals():
    """The record's headline: the campaign's named rung (else the last), × baseline judged by its
    95 % interval, MFU by the steps' p10-p90; met, not met, or not decided where the interval spans it."""
    assert (judged(10.2, 10.9, 10), judged(8.1, 8.2, 10), judged(9.5, 10.5, 10)) == ("met", "not met", "not decided")
    recs = {
        "perf/t9_baseline": rung("t9_baseline", 0, (1, 1, 1), (9, 10, 11), 0.05),
        "perf/t9_ladder_fast": rung("t9_ladder_fast", 2, (10.5, 10.2, 10.9), (95, 100, 105), 0.5),
        "perf/t9_ladder_slow": rung("t9_ladder_slow", 3, (8.1, 8.0, 8.2), (76, 80, 84), 0.4),
    }
    last = "\n".join(headline({"settings": {}}, recs))
    assert "perf/t9_ladder_slow" in last and last.count("| not met |") == 2
    named = "\n".join(headline({"settings": {"headline": "fast", "targets": {"mfu_published": 0.45}}}, recs))
    assert "perf/t9_ladder_fast" in named and "| met |" in named
    assert "47.5%" in named  # MFU's low end: 0.5 x p10 95 / median 100 > 45 %: met
    assert headline({}, {}) == ["No cumulative ladder rung finished: no headline."]


def test_record_names_the_commit_that_ran(tmp_path, monkeypatch):
    """A device copy's .git names another commit: N00BGPT_GIT_COMMIT sets the ledger's, and
    `--commit` rebuilds a record with the right one, saying what the ledger named."""
    from steps.tracking.provenance import git_commit

    monkeypatch.setenv("N00BGPT_GIT_COMMIT", "feedbeef")
    assert git_commit() == "feedbeef"
    ledger = {"started_utc": "2026-01-02T00:00:00Z", "commit": "0ld-dirty", "cells": {}, "command": "c"}
    ledger["env"] = {"device": "NVIDIA H200", "versions": {}}
    (tmp_path / "campaign.json").write_text(json.dumps(ledger))
    path = write_record(tmp_path, tmp_path / "docs", commit="abcdef1234567")
    assert path.name == "2026-01-02-h200-abcdef1234.md"
    text = path.read_text()
    assert "commit abcdef1234567" in text and "the ledger named 0ld-dirty" in text


def wait_for(path: Path, check, timeout: float) -> dict:
    """The ledger at `path` once check(ledger) holds (polled; the campaign rewrites it atomically)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and check(data := json.loads(path.read_text())):
            return data
        time.sleep(0.5)
    raise AssertionError(f"{path}: not reached in {timeout} s")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.slow
@pytest.mark.live
def test_a_killed_campaign_leaves_its_record_and_a_second_call_finishes_it(tmp_path):
    """The device tool's kill at a call's limit (SIGKILL) mid-cell: --out alone still makes the
    record (the finished cell's numbers, the running one named), the running job does not run on,
    and a second call with --skip-done runs only what is not ok, carrying the rest."""
    out, out2 = tmp_path / "out", tmp_path / "out2"
    cmd = [str(ROOT / "scripts" / "gpu-campaign"), "--rehearse", "--groups", "ladder t32"]
    env = {**clean_env(), "PYTHON": sys.executable}
    first = [*cmd, "--out", str(out), "--work", str(tmp_path / "w1")]
    proc = subprocess.Popen(first, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        running = wait_for(out / "campaign.json", lambda d: "pid" in d["cells"]["perf/t32_ladder_fused_ce"], 400)
    finally:
        proc.kill()
        proc.wait()
    job = running["cells"]["perf/t32_ladder_fused_ce"]["pid"]
    end = time.monotonic() + 60
    while alive(job) and time.monotonic() < end:
        time.sleep(0.5)
    assert not alive(job)  # SIGTERM at its campaign's death, not running on
    done = subprocess.run([*RECORD, str(out), "--to", str(tmp_path / "rec")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = Path(done.stdout.strip()).read_text()
    base = running["cells"]["perf/t32_baseline"]["record"]["metrics"]
    row = next(line for line in text.splitlines() if line.startswith("| t32_baseline |"))
    assert f"| {fmt(base['tokens_per_s'])} | {fmt(base['tokens_per_s_p10'])} |" in row
    assert "| perf/t32_ladder_fused_ce | stopped | running when the campaign was killed" in text
    # the second call: the baseline carried (its metrics.json restored for the rung), the rung runs
    second = [*cmd, "--out", str(out2), "--work", str(tmp_path / "w2"), "--skip-done", str(out / "campaign.json")]
    proc2 = subprocess.run(second, capture_output=True, text=True, env=env, timeout=600)
    assert proc2.returncode == 0, proc2.stderr[-4000:]
    cells = json.loads((out2 / "campaign.json").read_text())["cells"]
    assert cells["perf/t32_baseline"]["carried"].startswith(running["started_utc"])
    assert cells["perf/t32_ladder_fused_ce"]["status"] == "ok" and "carried" not in cells["perf/t32_ladder_fused_ce"]
    (record,) = out2.glob("*-cpu-*.md")
    text = record.read_text()
    assert "| t32_baseline |" in text and "| t32_ladder_fused_ce |" in text and "- **carried**" in text
