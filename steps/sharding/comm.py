"""Count what passes through torch's collectives, in steps/analytic/comm.py's ring convention for every
strategy (bytes one rank sends: 2(N-1)/N for an all-reduce, (N-1)/N for an all-gather or a
reduce-scatter, 1 for a send).

The from-scratch strategies call the wrappers below (only in-place primitives). Native torch code
(DDP's C++ reducer, FSDP2, DTensor) is counted by `NativeCommMode`, a dispatch mode that sees the
same c10d / functional-collective ops on their way to the process group.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from steps.analytic.comm import ring_bytes

warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).*")


class CommCounter:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.bytes = 0.0
        self.calls: Counter = Counter()
        self.detail: Counter = Counter()  # "<op>/<group size>" -> bytes
        self.groups: Counter = Counter()  # "0,2" (the group's global ranks) -> bytes: its mesh axis, its link

    def add(self, op: str, nbytes: int, group_size: int, ranks=None) -> None:
        sent = ring_bytes(op, nbytes, group_size)
        self.bytes += sent
        self.calls[op] += 1
        self.detail[f"{op}/{group_size}"] += sent
        if ranks is not None:
            self.groups[",".join(map(str, ranks))] += sent


COUNTER = CommCounter()


def _size(group) -> int:
    return dist.get_world_size(group)


def _ranks(group) -> list[int] | None:
    """The group's global ranks (None: the default group, every rank), or None if unknown."""
    try:
        return dist.get_process_group_ranks(group or dist.group.WORLD)
    except (RuntimeError, KeyError, ValueError):
        return None


def _send_pair(group, args) -> list[int] | None:
    """The global ranks of a native send (this rank and its peer, sorted, as scratch's isend), so a
    pipeline's sends count on the pp axis (links.per_link); None if the peer cannot be resolved."""
    try:
        return sorted((dist.get_rank(), dist.get_global_rank(group or dist.group.WORLD, int(args[2]))))
    except (RuntimeError, ValueError, TypeError, IndexError):
        return None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(t: torch.Tensor, group=None) -> torch.Tensor:
    """In-place SUM all-reduce (gloo has no PREMUL_SUM; callers divide for an average)."""
    COUNTER.add("all_reduce", _nbytes(t), _size(group), _ranks(group))
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


def all_gather_into_tensor(out: torch.Tensor, inp: torch.Tensor, group=None) -> torch.Tensor:
    """`out` is flat (gloo rejects a (N, n) output), N× the size of `inp`."""
    COUNTER.add("all_gather", _nbytes(out), _size(group), _ranks(group))
    dist.all_gather_into_tensor(out, inp, group=group)
    return out


def reduce_scatter_tensor(out: torch.Tensor, inp: torch.Tensor, group=None) -> torch.Tensor:
    COUNTER.add("reduce_scatter", _nbytes(inp), _size(group), _ranks(group))
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM, group=group)
    return out


def all_to_all_single(out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, group=None) -> torch.Tensor:
    """Rows of `inp` (in_splits[r] to rank r) exchanged; charged on the input, (N-1)/N of it: what a
    rank sends under balanced routing. Uneven routing moves bytes between ranks, but every row sent
    is received and sent back once, so the mean over the ranks is exact (steps/analytic/comm.py)."""
    COUNTER.add("all_to_all", _nbytes(inp), _size(group), _ranks(group))
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)
    return out


def isend(t: torch.Tensor, dst: int):
    COUNTER.add("send", _nbytes(t), 2, sorted((dist.get_rank(), dst)))
    return dist.isend(t, dst)


def recv(t: torch.Tensor, src: int) -> torch.Tensor:
    dist.recv(t, src)
    return t


def _to_cpu(obj):
    """Tensors (in dicts, lists, tuples) moved to the CPU: a pickled CUDA tensor is rebuilt on the
    device it left, so rank 0 would receive rank 1's tensors on cuda:1 (a CUDA context on another
    rank's GPU, then tensors on two devices in one comparison). Callers compare on the CPU."""
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj.detach().cpu() if isinstance(obj, torch.Tensor) else obj


def all_states(local: dict[str, torch.Tensor], group=None) -> list[dict[str, torch.Tensor]]:
    """Every rank's {name: tensor} on every rank, on the CPU, in rank order (parity only: not counted)."""
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, _to_cpu(local), group=group)
    return parts


def gather_state(local: dict[str, torch.Tensor], group=None) -> dict[str, torch.Tensor]:
    """Every rank's {name: tensor} merged on every rank (a pipeline's stages), for the parity check."""
    return {k: v for p in all_states(local, group) for k, v in p.items()}


def from_rank0(obj):
    """Rank 0's `obj` on every rank, tensors on the CPU (the single-device reference every rank
    checks itself against; not counted)."""
    box = [_to_cpu(obj) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---- native code: count the ops the process group receives -----------------------------------
def _group(args):
    """The process group a c10d / functional-collective op names, or None."""
    for a in args:
        if isinstance(a, dist.ProcessGroup):
            return a
        if type(a).__name__ == "ScriptObject":  # the dispatcher hands c10d ops a boxed group
            return dist.ProcessGroup.unbox(a)
        if isinstance(a, str) and a:  # functional collectives name their group
            try:
                return dist.distributed_c10d._resolve_process_group(a)
            except Exception:  # noqa: BLE001
                pass
    return None


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


class NativeCommMode(TorchDispatchMode):
    """Adds every collective that reaches the dispatcher to a CommCounter (same convention).

    all_gather ops are charged on their output (input × N), reduce-scatters on their input,
    all-reduces on their input, send on its tensor; `recv`/`wait` cost nothing extra."""

    def __init__(self, counter: CommCounter, world: int):
        super().__init__()
        self.counter, self.world = counter, world

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1].rstrip("_")
        ns = func.namespace
        if ns in ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"):
            group = _group(list(args) + list((kwargs or {}).values()))
            n = group.size() if group is not None else self.world
            ranks = _ranks(group) if group is not None else list(range(self.world))
            inb = sum(_nbytes(t) for t in _tensors(args[0])) if args else 0
            if name in ("allreduce", "all_reduce", "allreduce_coalesced", "all_reduce_coalesced"):
                self.counter.add("all_reduce", inb, n, ranks)
            elif name in (
                "_allgather_base",
                "allgather_into_tensor_coalesced",
                "all_gather_into_tensor",
                "all_gather_into_tensor_coalesced",
                "allgather",
            ):
                src = (
                    args[1] if name in ("_allgather_base", "allgather_into_tensor_coalesced", "allgather") else args[0]
                )
                self.counter.add("all_gather", sum(_nbytes(t) for t in _tensors(src)) * n, n, ranks)
            elif name in (
                "_reduce_scatter_base",
                "reduce_scatter_tensor_coalesced",
                "reduce_scatter_tensor",
                "reduce_scatter_tensor_coalesced",
                "reduce_scatter",
            ):
                src = (
                    args[1]
                    if name in ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter")
                    else args[0]
                )
                self.counter.add("reduce_scatter", sum(_nbytes(t) for t in _tensors(src)), n, ranks)
            elif name in ("all_to_all_single", "alltoall_base"):  # functional: (input, ...); c10d: (output, input, ...)
                self.counter.add("all_to_all", _nbytes(args[0] if name == "all_to_all_single" else args[1]), n, ranks)
            elif name in ("broadcast",):
                self.counter.add("broadcast", inb, n, ranks)
            elif name in ("send",):  # c10d::send(tensors, group, dst: the group's rank, tag)
                self.counter.add("send", inb, 2, _send_pair(group, args))
        return func(*args, **(kwargs or {}))
