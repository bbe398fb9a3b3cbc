"""The stage processes of conftest's `run_stage`, forked from a process that has already imported
the heavy libraries, instead of each `python -m steps.<stage>` importing torch, MLflow, pandas,
datasets and transformers again (6-7 s of CPU on a slow 2-core host, most of a small stage's run).

The child is a process of its own, as `python -m` would start it: `runpy` runs the stage module as
`__main__` with the same arguments, in the job's folder, with its stdout and stderr in files, and
exits with the stage's exit status after Python's exit handlers. The server is multiprocessing's
forkserver, started once per test process in the environment `clean_env()` gives; a call made in
any other environment (a test that set a variable a library reads when it is imported) runs a
plain `python -m` instead. The Snakemake-run jobs (the smoke DAG, the fault tests) always run the
rule's own shell command."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import sys
import traceback
from multiprocessing import forkserver

PRELOAD = ["torch", "mlflow", "mlflow.store.tracking.sqlalchemy_store", "pandas", "datasets", "transformers"]


def stage_main(module: str, args: list[str], cwd: str, out: str, err: str, env_extra: dict) -> None:
    """In the forked child: `python -m <module> <args>` in `cwd`, stdout and stderr to `out`/`err`,
    with `env_extra` set (variables read at run time, e.g. COLUMNS, not when a library is imported)."""
    os.environ.update(env_extra)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(cwd)
    sys.argv = [module, *args]
    sys.path.insert(0, cwd)  # `python -m` puts the working folder first
    code: int | str | None = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


_SERVER: dict = {}  # this test process's server: its context and the environment it started in


def context(env: dict) -> multiprocessing.context.ForkServerContext | None:
    """The forkserver context, its server started (once, at the first call) in `env` with PRELOAD
    imported; None when `env` is not the environment it started in."""
    if _SERVER:
        return _SERVER["ctx"] if env == _SERVER["env"] else None
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _SERVER.update(env=env, ctx=ctx)
    return ctx
