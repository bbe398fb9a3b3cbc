"""The stage processes of conftest's `run_stage`, forked from a process that has already imported
the heavy libraries, instead of each `python -m steps.<stage>` importing torch, MLflow, pandas,
datasets and transformers again (6-7 s of CPU on a slow 2-core host, most of a small stage's run).

The child is a process of its own, as `python -m` would start it: `runpy` runs the stage module as
`__main__` with the same arguments, in the job's folder, with its stdout and stderr in files, and
exits with the stage's exit status after Python's exit handlers. The server is multiprocessing's
forkserver, started once per test process in the environment the session started with (conftest's
base_environment). A call whose environment differs from that only in RUN_TIME (variables read
when a run starts, never when a library is imported; pytest's name of the running test among them,
which changes with every test) forks too, and the child gets the call's whole environment. A call
in any other environment (a test that set a variable a library reads when it is imported, e.g.
HF_HUB_OFFLINE or XDG_CACHE_HOME, which huggingface_hub reads once, at import) runs a plain
`python -m` instead. The Snakemake-run jobs (the smoke DAG, the fault tests) always run the rule's
own shell command."""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
from multiprocessing import forkserver

from steps.jobserver import RUN_TIME, run_as_main  # the variables a forked call may differ in

PRELOAD = ["torch", "mlflow", "mlflow.store.tracking.sqlalchemy_store", "pandas", "datasets", "transformers"]


def stage_main(module: str, args: list[str], cwd: str, out: str, err: str, env: dict) -> None:
    """In the forked child: `python -m <module> <args>` in `cwd` and the environment `env`, stdout
    and stderr to `out`/`err`."""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR is in RUN_TIME: recomputed from the call's when first asked
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(cwd)
    sys.argv = [module, *args]
    sys.path.insert(0, cwd)  # `python -m` puts the working folder first
    os._exit(run_as_main(module))


_SERVER: dict = {}  # this test process's server: its context and the environment it started in


def _at_import(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in RUN_TIME}


def server_env() -> dict:
    """The environment the server started in ({} before it starts)."""
    return dict(_SERVER.get("env", {}))


def blocking(env: dict) -> list[str]:
    """The variables that keep a call in `env` from forking: those it sets differently from the
    server's environment, beyond RUN_TIME ([] before the server starts)."""
    if not _SERVER:
        return []
    a, b = _at_import(env), _at_import(_SERVER["env"])
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def context(env: dict, base: dict) -> multiprocessing.context.ForkServerContext | None:
    """The forkserver context, its server started (once, at the first call) in `base` with PRELOAD
    imported; None when `env` differs from the environment it started in beyond RUN_TIME."""
    if _SERVER:
        return None if blocking(env) else _SERVER["ctx"]
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(base)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _SERVER.update(env=base, ctx=ctx)
    return context(env, base)
