"""`python -m steps.jobserver SOCKET`: the job server itself (steps/jobserver/__init__.py says what it
is for): imports PRELOAD, listens on SOCKET, forks one process per job that connects."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
import traceback

import numpy

from steps.jobserver import (
    FORWARDED,
    LAB_MODULE,
    PRELOAD,
    _recv,
    _send,
    blocking,
    interpreter,
    recv_request,
    run_as_main,
    threads_of,
)


def _child(conn: socket.socket, listener: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked process: become `python -m <module> <args>` of the caller, then report the exit.
    Never returns: whatever happens here ends this process (an exception let out would run the
    server's own loop and its `finally` here, which unlinks the server's socket)."""
    code = 1
    try:
        code = _become(conn, listener, request, fds)
    except BaseException:  # noqa: BLE001 - the job could not start (its folder gone, its caller gone)
        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
    finally:
        with contextlib.suppress(BaseException):
            _send(conn, {"exit": code})
        os._exit(code)


def _become(conn: socket.socket, listener: socket.socket, request: dict, fds: list[int]) -> int:
    from steps import lifeline

    # Signals: the server's handlers go (its SIGTERM one would unlink the server's socket from here), held
    # back since the fork (serve). A process group of its own: a signal to the caller's group (the
    # terminal's Ctrl-C, sent to snakemake's, where the server runs) reaches this job once, forwarded by
    # its caller, as in its own process; the group's copy and the forwarded one would be two
    # KeyboardInterrupts, the second cutting the first one's ending short (its MLflow run left RUNNING).
    os.setpgid(0, 0)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    listener.close()
    for waiting in WAITING.values():  # other callers' connections: theirs to see closed when the server is gone
        for other in waiting:
            other.close()
    _send(conn, {"pid": os.getpid()})  # the caller forwards its signals to this pid from now on
    if _recv(conn) != {"go": True}:  # the caller gave up waiting, or died: no one to run this job for
        print(f"pid {os.getpid()}: the caller of {request['module']} hung up before it started", flush=True)
        return 1
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own descriptors, kept open
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # recomputed from this job's TMPDIR when first asked
    numpy.random.seed()  # fresh entropy, as a new process's (Python's `random` reseeds itself at fork)
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    sys.argv = [request["module"], *request["args"]]
    sys.path.insert(0, request["cwd"])  # `python -m` puts the working folder first
    apply_threads(threads_of(request["env"]))
    if request["module"] != LAB_MODULE:  # the lab run's start and end write to the terminal: no line there
        print(f"job server: forked from pid {os.getppid()} (pid {os.getpid()})", file=sys.stderr, flush=True)
    lifeline.die_with_caller(request["caller"])
    code = run_as_main(request["module"])
    with lifeline.finishing():  # done: the caller exiting after this status is no death to act on
        pass
    return code


def apply_threads(n: int | None) -> None:
    """The job's thread count on the pools the server's libraries loaded before its variables were
    set: torch's intra-op pool, and OpenMP's and BLAS's (threadpoolctl), as OMP_NUM_THREADS=n would."""
    if n is None:
        return
    import torch
    from threadpoolctl import threadpool_limits

    threadpool_limits(n)
    torch.set_num_threads(n)


STATUSES: dict[int, int] = {}  # forked jobs reaped: pid -> exit status (128 + N for signal N)
WAITING: dict[int, list[socket.socket]] = {}  # callers asking for a pid's status, answered as it is reaped


def _reap() -> None:
    """Collect the forked jobs that ended: the log names each with its CPU time (steps/jobserver/cost.py),
    and a caller waiting for one's status (it lost its own line: the job exec'd, or was killed) gets it."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if not pid:
                return
            code = os.waitstatus_to_exitcode(status)
            STATUSES[pid] = 128 - code if code < 0 else code
            cpu = usage.ru_utime + usage.ru_stime
            print(f"reaped pid {pid}: exit {STATUSES[pid]}, cpu {cpu:.3f} s", flush=True)
            for conn in WAITING.pop(pid, []):
                _answer(conn, {"exit": STATUSES[pid]})


def _answer(conn: socket.socket, obj: dict) -> None:
    with contextlib.suppress(OSError):
        _send(conn, obj)
    conn.close()


def _stop(path: str) -> None:
    """SIGTERM (the DAG's end): the socket goes, then the process, at once: the interpreter's own
    teardown of the preloaded libraries takes seconds, and the forked jobs are processes of their own."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    sys.stdout.flush()
    os._exit(0)


def serve(path: str) -> None:
    """Import PRELOAD, then fork one process per job that connects, until SIGTERM or snakemake's end."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    started_env = dict(os.environ)
    signal.signal(signal.SIGTERM, lambda s, f: _stop(path))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(64)
    listener.settimeout(0.5)  # between calls, the forked jobs that ended are reaped
    os.replace(tmp, path)  # the socket appears only once the server can fork: earlier jobs run on their own
    print(f"job server {os.getpid()}: {len(PRELOAD)} modules loaded, listening on {path}", flush=True)
    try:
        while True:
            _reap()
            try:
                conn, _ = listener.accept()
            except (InterruptedError, TimeoutError):
                continue
            conn.settimeout(None)
            try:
                request, fds = recv_request(conn)
            except (OSError, ValueError):
                request, fds = None, []
            if request is None:  # the caller hung up or sent no request
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            if "status_of" in request:  # {"status_of": pid}: answered now, or once that job is reaped
                pid = int(request["status_of"])
                if pid in STATUSES:
                    _answer(conn, {"exit": STATUSES[pid]})
                else:
                    WAITING.setdefault(pid, []).append(conn)
                continue
            why = blocking(request["env"], started_env)
            why = why and f"its environment differs from the server's in {', '.join(why[:5])}"
            if request.get("interpreter") != interpreter():  # `python` on the job's PATH: another interpreter
                why = f"its interpreter {request.get('executable')} is not the server's {sys.executable}"
            if why or len(fds) != 3:
                _answer(conn, {"why": why or "its stdin, stdout and stderr did not come with it"})
                for fd in fds:
                    os.close(fd)
                continue
            signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the forked job has its own handlers
            pid = os.fork()
            if pid == 0:
                _child(conn, listener, request, fds)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
            STATUSES.pop(pid, None)  # a pid reused: its earlier job's status is no answer for this one
            print(f"forked {request['module']} for pid {request['caller']}: pid {pid}", flush=True)
            for fd in fds:
                os.close(fd)
            conn.close()  # the forked job holds its own copy: it sends its pid, then its exit status
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m steps.jobserver SOCKET_PATH")
    serve(sys.argv[1])
