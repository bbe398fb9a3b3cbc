"""Where the fast backend's time goes on the GPT step: a cProfile of the `gpt_fast` cell's AdamW step
(not a record: a profile of this machine, at that moment, for docs/minitorch.md).

    python -m steps.minitorch.profile [--configfile configs/default.yaml] [--cell gpt_fast] [--steps 5]

Builds the cell's GPT (its config's shape; random token ids over its vocabulary instead of the corpus,
which the step's cost does not depend on), runs warm-up steps so Numba's compile is out of the way, then
profiles `--steps` steps of our engine and times the same steps of torch eager (fp64, its threads as the
cell reserves them). Prints the step times and the functions that take the time, grouped by what they do:
the kernels (map/zip/reduce/matmul), the autograd bookkeeping, allocation and the optimizer.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import numpy as np

# what a profiled function is, by the file it lives in (steps/minitorch/...)
GROUPS = {
    "fast_ops.py": "kernels (Numba map/zip/reduce/matmul)",
    "tensor_ops.py": "backend glue (allocation, broadcasting, batched matmul)",
    "tensor_data.py": "strided storage (shapes, strides, permute/view)",
    "tensor_functions.py": "differentiable ops (forward/backward, calling the kernels)",
    "autodiff.py": "autograd (topological sort, backpropagate)",
    "tensor.py": "Tensor wrapper",
    "optim.py": "AdamW",
    "nn.py": "nn functions (softmax, GELU, ...)",
    "models.py": "model code",
    "module.py": "Module",
}


def build(configfile: str, cell: str):
    """(our DecoderLM trainer pair, a batch, the cell's threads) for `cell` of `configfile`."""
    import torch

    from steps.config import cell_config, load_config
    from steps.minitorch.config import MinitorchConfig
    from steps.minitorch.models import DecoderLM
    from steps.minitorch.stage import Trainers, _backend
    from steps.models.gpt import GPTLMHeadModel

    p = MinitorchConfig.of(cell_config(load_config(configfile), "minitorch", cell)["params"])
    g = p.gpt
    threads = p.job_threads or 1
    torch.set_num_threads(threads)
    if _backend(p.backend) == "fast":
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.manual_seed(0)
    model = GPTLMHeadModel(g.knobs(vocab_size=g.vocab_size, dropout=0.0)).double()
    trainers = Trainers(model, DecoderLM.from_torch(model, _backend(p.backend)), g.lr, g.weight_decay)
    x = np.random.default_rng(0).integers(0, g.vocab_size, size=(g.batch_size, g.block_size))
    return trainers, x, threads, g


def timed(step, x, n: int) -> float:
    """Median seconds of `n` calls of step(x)."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step(x)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def grouped(stats: pstats.Stats) -> dict[str, float]:
    """Own (tottime) seconds per GROUPS entry; everything else by its file name."""
    out: dict[str, float] = {}
    for (file, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        name = file.rsplit("/", 1)[-1]
        group = GROUPS.get(name, f"other: {name}" if name != "~" else f"builtins: {func}")
        out[group] = out.get(group, 0.0) + tottime
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def matmul_by_shape(step, x, n: int) -> dict[str, tuple[int, float]]:
    """Calls and seconds of the backend's matmul per (a shape) @ (b shape) over `n` steps, by
    wrapping TensorBackend.matmul for the duration (the one entry every matmul goes through)."""
    from steps.minitorch.tensor_ops import TensorBackend

    seen: dict[str, tuple[int, float]] = {}
    original = TensorBackend.matmul

    def counted(self, a, b):
        t = time.perf_counter()
        out = original(self, a, b)
        key = f"{tuple(a.shape)} @ {tuple(b.shape)}"
        calls, secs = seen.get(key, (0, 0.0))
        seen[key] = (calls + 1, secs + time.perf_counter() - t)
        return out

    TensorBackend.matmul = counted
    try:
        for _ in range(n):
            step(x)
    finally:
        TensorBackend.matmul = original
    return dict(sorted(seen.items(), key=lambda kv: -kv[1][1]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m steps.minitorch.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", default="configs/default.yaml")
    ap.add_argument("--cell", default="gpt_fast")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    trainers, x, threads, g = build(args.configfile, args.cell)
    for _ in range(2):  # Numba compiles (or loads its cache) on the first steps
        trainers.step_ours(x)
        trainers.step_torch(x)
    ours, torch_s = timed(trainers.step_ours, x, args.steps), timed(trainers.step_torch, x, args.steps)
    shape = f"{g.n_layer} layers, d {g.n_embd}, {g.n_head} heads, T {g.block_size}, B {g.batch_size}"
    shape += f", vocab {g.vocab_size}"
    print(f"{args.cell}: {shape}, fp64, {threads} thread(s)")
    print(f"step: ours {ours * 1e3:.1f} ms, torch eager {torch_s * 1e3:.1f} ms (ours {torch_s / ours:.3f}x torch)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        trainers.step_ours(x)
    prof.disable()
    stats = pstats.Stats(prof)
    total = sum(v for v in grouped(stats).values())
    print(f"\nown time by group over {args.steps} profiled steps ({total:.2f} s under the profiler):")
    for group, secs in grouped(stats).items():
        if secs / total >= 0.01:
            print(f"  {100 * secs / total:5.1f} %  {group}")
    shapes = matmul_by_shape(trainers.step_ours, x, args.steps)
    step_s = args.steps * ours
    print(f"\nmatmuls by shape over {args.steps} steps (share of the unprofiled step time):")
    for key, (calls, secs) in list(shapes.items())[:8]:
        print(f"  {100 * secs / step_s:5.1f} %  {calls // args.steps} a step  {key}")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
    print("\n" + buf.getvalue().split("\n", 4)[-1].strip())


if __name__ == "__main__":
    main()
