"""`python -m steps.perf --out DIR --cfg JSON`: one perf cell.

CPU peak memory is read from VmHWM, which only tracks what tensors use if glibc returns freed
blocks to the kernel: small MALLOC_MMAP_THRESHOLD_ makes every tensor above 64 KiB its own mmap.
glibc reads it at process start, so the process re-executes itself with it set."""

import os
import sys

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}

if __name__ == "__main__":
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, "-m", "steps.perf", *sys.argv[1:]], {**os.environ, **MALLOC_ENV})
    from steps.perf import STAGE

    STAGE.main()
