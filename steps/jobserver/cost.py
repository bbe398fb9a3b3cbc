"""The fixed cost of a job, measured: `python -m steps.jobserver.cost [--pairs 20] [--out FILE.md]`.

The lightest stage job there is (prepare_corpus on the smoke config's 60 documents: open its MLflow
run, read a few plays, log, close) run by its real command, `python -m steps.prepare_corpus ...`,
in its own process and handed to a job server (steps/jobserver/), interleaved pair by pair in this
one process (steps/paired.py): per job its wall time and its CPU seconds (its own process's; for a
forked job the caller's plus the forked process's, which the server reports as it reaps it). The
ratio of the two is given with its 95 % interval; the machine (CPU model and flags) with it. Writes
a dated Markdown record (docs/benchmarks/) when `--out` names one.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from steps.commandline import parser
from steps.config import cell_config, load_config
from steps.jobserver import SOCKET_ENV, wait_listening
from steps.paired import ratio_of_pairs

ROOT = Path(__file__).resolve().parents[2]
REAPED = re.compile(r"reaped pid (\d+): exit (-?\d+), cpu ([0-9.]+) s")


def job_command(work: Path) -> list[str]:
    """prepare_corpus's command as its rule writes it, with the smoke config's params."""
    config = load_config(ROOT / "configs" / "default.yaml", ROOT / "configs" / "smoke.yaml")
    cfg = {
        "stage": "prepare_corpus",
        "cell": "main",
        "params": cell_config(config, "prepare_corpus", "main")["params"],
        "common": {"seed": 1234, "device": "cpu", "threads": 1, "tracking": {"uri": None}},
    }
    out = work / "results"
    return [
        sys.executable,
        "-m",
        "steps.prepare_corpus",
        "--output",
        f"data={out / 'data' / 'corpus'}",
        "--output",
        f"metrics={out / 'prepare_corpus' / 'main' / 'metrics.json'}",
        "--cfg",
        json.dumps(cfg),
    ]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_job(cmd: list[str], work: Path, env: dict, server_log: Path | None) -> tuple[float, float]:
    """(wall s, CPU s) of one job, fresh folder each time (no job finds another's results)."""
    for f in (work / "results").rglob("*"):
        if f.is_file() and "mlflow" not in f.name and "mlruns" not in f.parts:
            f.unlink()
    cpu0, t0 = children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"the job failed:\n{proc.stderr[-3000:]}")
    if server_log is not None:
        forked = re.search(r"forked from pid \d+ \(pid (\d+)\)", proc.stderr)
        if not forked:
            sys.exit(f"the job was not forked by the server:\n{proc.stderr[-2000:]}")
        deadline = time.time() + 10
        while not (m := [x for x in REAPED.finditer(server_log.read_text()) if x[1] == forked[1]]):
            if time.time() > deadline:
                sys.exit(f"the server did not report pid {forked[1]}'s CPU time")
            time.sleep(0.05)
        cpu += float(m[0][3])
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    ap = parser("python -m steps.jobserver.cost", __doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="interleaved pairs (own process, forked)")
    ap.add_argument("--out", type=Path, help="write the Markdown record here")
    args = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update({"PYTHONHASHSEED": "0", "N00BGPT_RUN_CACHE": "off", "OMP_NUM_THREADS": "1"})
    with tempfile.TemporaryDirectory(prefix="n00bgpt-jobcost-") as tmp:
        tmp = Path(tmp)
        sock, server_log = tmp / "socket", tmp / "server.log"
        with open(server_log, "w") as log:
            serve = [sys.executable, "-m", "steps.jobserver", str(sock)]
            server = subprocess.Popen(serve, env=env, stdout=log, stderr=log)
            try:
                if why := wait_listening(server, str(sock), 300):
                    sys.exit(f"the job server did not start ({why}):\n{server_log.read_text()[-2000:]}")
                work = tmp / "work"
                work.mkdir()
                cmd = job_command(work)
                own_env, forked_env = {**env, SOCKET_ENV: "off"}, {**env, SOCKET_ENV: str(sock)}
                one_job(cmd, work, own_env, None)  # warm-up: the page cache, the store's schema
                one_job(cmd, work, forked_env, server_log)
                rows = {"own": [], "forked": []}
                for i in tqdm(range(args.pairs), desc="job cost (pairs)"):
                    order = ("own", "forked") if i % 2 == 0 else ("forked", "own")
                    for how in order:
                        e, s = (own_env, None) if how == "own" else (forked_env, server_log)
                        rows[how].append(one_job(cmd, work, e, s))
            finally:
                server.terminate()
                server.wait(30)
        imports = import_table(cmd, work, own_env)
    report(rows, imports, args.out)


def import_table(cmd: list[str], work: Path, env: dict, top: int = 8) -> list[tuple[str, float]]:
    """The job's costliest top-level imports in its own process (`python -X importtime`): (module, s)."""
    proc = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=work, env=env, capture_output=True, text=True)
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2]
        if len(name) - len(name.lstrip()) <= 3:  # top level and its direct imports
            rows.append((name.strip(), int(parts[1]) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:top]


def report(rows: dict[str, list[tuple[float, float]]], imports: list[tuple[str, float]], out: Path | None) -> None:
    from steps.tracking.provenance import cpu_flags, cpu_model, git_commit

    def mean(xs):
        return sum(xs) / len(xs)

    wall = ratio_of_pairs([w for w, _ in rows["forked"]], [w for w, _ in rows["own"]])
    cpu = ratio_of_pairs([c for _, c in rows["forked"]], [c for _, c in rows["own"]])
    flags = cpu_flags()
    lines = [
        f"# The fixed cost of a job: {time.strftime('%Y-%m-%d')}, {cpu_model()}, {os.cpu_count()} cores",
        "",
        f"Written by `python -m steps.jobserver.cost --pairs {wall.pairs}` (steps/jobserver/cost.py) at commit "
        f"{git_commit()}.",
        f"CPU flags: {flags}.",
        "The job: prepare_corpus on the smoke config (60 documents), its real command, in its own process and",
        "forked by the job server, interleaved pair by pair. CPU = user + system seconds of the job's processes.",
        "",
        "| job | wall s (mean) | CPU s (mean) |",
        "|---|---|---|",
        *(f"| {how} | {mean([w for w, _ in r]):.3f} | {mean([c for _, c in r]):.3f} |" for how, r in rows.items()),
        "",
        f"- forked vs own process, wall: {wall.ratio:.2f}× faster [{wall.low:.2f}, {wall.high:.2f}], "
        f"{wall.pairs} pairs",
        f"- forked vs own process, CPU: {cpu.ratio:.2f}× less [{cpu.low:.2f}, {cpu.high:.2f}], {cpu.pairs} pairs",
        f"- load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
        "Where the own process's time goes: its costliest imports (`python -X importtime`, cumulative, one run):",
        "",
        "| module | import s |",
        "|---|---|",
        *(f"| {name} | {s:.3f} |" for name, s in imports),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


if __name__ == "__main__":
    main()
