"""torchrun whose ranks are forked, not exec'd: `python -m steps.sharding.torchrun --preload MODULES
<torchrun's own arguments> --start-method forkserver --run-path /abs/steps/sharding/worker.py ...`.

Plain torchrun starts every rank as a fresh `python -m steps.sharding.worker`, which imports torch,
DTensor and the engine again: 4-5 s of CPU a rank on a 2-core host, most of a small cell's run and
8 times over for a world-8 cell. With `--run-path` torchrun's agent runs the worker as a function
entrypoint, started by multiprocessing with `--start-method` (torch's own options); with the
forkserver method the ranks fork from one server process. This module only tells that server what
to import before it forks (multiprocessing.set_forkserver_preload: the worker and the cell's engine),
then hands the rest of the command line to torchrun unchanged: the rendezvous, the agent, its
fail-fast teardown and its exit status are torchrun's.

The ranks are still processes of their own (a process group each side of gloo's TCP, their own
pid, memory and exit status); only the imports are shared, copy-on-write. The server starts from
a bare interpreter (never a fork of the agent, whose rendezvous store runs threads) and touches no
GPU: launch.py uses this for gloo cells only (start_method auto), NCCL ranks keep torchrun's exec.
"""

from __future__ import annotations

import multiprocessing
import sys
from multiprocessing import forkserver


def main(argv: list[str]) -> None:
    if argv[:1] != ["--preload"] or len(argv) < 2:
        sys.exit("usage: python -m steps.sharding.torchrun --preload MOD[,MOD...] <torchrun arguments>")
    multiprocessing.set_forkserver_preload(argv[1].split(","))
    forkserver.ensure_running()  # the server imports its modules while this process imports torchrun's
    from torch.distributed.run import main as torchrun_main

    torchrun_main(argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
