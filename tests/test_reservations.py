"""The cores each job of the default DAG reserves (Snakemake's `threads`), read from a real dry run
with `--cores 2`: the default DAG's 20-minute budget on 2 cores counts reserved core-seconds, so a job
that only skips, or whose work is single-threaded, reserves one core and leaves the other to a
second job (configs/README.md, "The 20-minute budget")."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT, SNAKEFILE


def reserved_threads(tmp_path, *args: str) -> dict[tuple[str, str], int]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--cores",
            "2",
            "-s",
            str(SNAKEFILE),
            "--directory",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for block in re.split(r"\n(?=\S*rule \w+:)", proc.stdout):
        rule, cell = re.search(r"rule (\w+):", block), re.search(r"wildcards: cell=(\S+)", block)
        if rule:
            threads = re.search(r"threads: (\d+)", block)
            out[rule.group(1), cell.group(1) if cell else ""] = int(threads.group(1)) if threads else 1
    return out


def test_default_dag_reserves_one_core_where_a_job_cannot_use_two(tmp_path):
    threads = reserved_threads(tmp_path)
    perf = {c: n for (r, c), n in threads.items() if r == "perf"}
    # CUDA-only knobs on the CPU default: the job skips after its imports, on one core
    assert {c for c, n in perf.items() if n == 1} == {"amp_fp16", "tf32", "fused_triton", "cuda_graphs", "fp8"}
    assert perf["baseline"] == perf["compile"] == 2  # a timed cell takes every core (--cores 2)
    mt = {c: n for (r, c), n in threads.items() if r == "minitorch"}
    assert mt == {
        "ops_reference": 1,
        "ops_fast": 2,
        "ops_cuda": 1,
        "gpt_reference": 1,
        "gpt_fast": 1,
        "gpt_cuda": 1,
        "classifier_fast": 2,
    }
    one_core = ("sharding", "word2vec", "scale", "components", "gpt_parity")
    assert {n for (r, _), n in threads.items() if r in one_core} == {1}
    assert threads["gpt_train", "main"] == 2 and {n for (r, _), n in threads.items() if r == "mcq_finetune"} == {2}


def test_a_job_runs_torch_on_the_cores_its_rule_reserved(tmp_path):
    """StageRun.use_threads(job_threads): what a section's job_threads reserves, torch uses."""
    import torch

    from steps.core.run import StageRun

    before = torch.get_num_threads()
    try:
        ctx = StageRun("components", "main", {}, {"seed": 1, "threads": 2}, tmp_path)
        ctx.use_threads(0)  # 0: the global threads, torch untouched
        assert ctx.threads == 2 and ctx.info["threads"] == 2 and torch.get_num_threads() == before
        ctx.use_threads(1)
        assert ctx.threads == 1 and ctx.info["threads"] == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_minitorch_fast_kernels_run_on_the_reserved_cores(tmp_path):
    """gpt_fast reserves one core (job_threads 1): Numba's prange threads follow, as torch's do."""
    import numba

    from steps.core.run import StageRun
    from steps.minitorch.stage import use_numba_threads

    before = numba.get_num_threads()
    try:
        ctx = StageRun("minitorch", "gpt_fast", {}, {"seed": 1, "threads": 2}, tmp_path)
        ctx.use_threads(1)
        assert use_numba_threads(ctx) == 1 == numba.get_num_threads() and ctx.info["numba_threads"] == 1
        ctx.threads = 0  # 0: every thread Numba started with
        assert use_numba_threads(ctx) == numba.config.NUMBA_NUM_THREADS
    finally:
        numba.set_num_threads(before)
