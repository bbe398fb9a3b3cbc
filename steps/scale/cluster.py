"""A cluster description (the config's `scale.clusters.<name>`) and the α–β cost of a collective.

A collective over n ranks, run as a ring, takes `steps` latency hops and moves the ring-equivalent
bytes one rank sends (steps/analytic/comm.py's RING factors) over the slowest link it crosses:

  time = steps · α + bytes / β        steps: all-reduce 2(n-1), all-gather / reduce-scatter / all-to-all n-1, send 1

Placement follows the mesh order (pp, dp, fsdp, tp: tp on neighbouring GPUs). An axis whose ranks
all sit in one node (its stride × size ≤ GPUs per node) runs on NVLink (`intra`); any other crosses
the inter-node network, each GPU through its own NIC (`inter`, per GPU: exact for an axis whose
stride is ≥ a node, conservative when a ring could spread over several NICs).
"""

from __future__ import annotations

from dataclasses import dataclass

from steps.scale.scale_plan import ScalePlan
from steps.sharding.plan import AXES

STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,  # pairwise exchange: one peer a step
}


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s one GPU sends
    latency: float  # seconds per hop


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    memory_bytes: float
    peak_flops: float  # dense bf16 FLOP/s per GPU
    mfu: float  # fraction of peak the executed FLOPs reach (see the config for its source)
    intra: Link
    inter: Link

    @classmethod
    def from_config(cls, name: str, c: dict) -> "Cluster":
        def link(x):
            return Link(x["bandwidth_gbs"] * 1e9, x["latency_us"] * 1e-6)

        return cls(
            name, c["gpus_per_node"], c["gpu_memory_gib"] * 2**30, c["peak_tflops"] * 1e12, c["mfu"],
            link(c["intra"]), link(c["inter"]),
        )  # fmt: skip

    def link(self, plan: ScalePlan, axis: str) -> Link:
        axis = "fsdp" if axis == "dp_shard" else axis  # fsdp × ep: fsdp's stride × size spans both
        stride = 1
        for inner in AXES[AXES.index(axis) + 1 :]:
            stride *= plan.axis(inner)
        return self.intra if stride * plan.axis(axis) <= self.gpus_per_node else self.inter

    def collective_time(self, op: str, nbytes: float, n: int, link: Link, calls: int = 1) -> float:
        """Seconds for `calls` collectives moving `nbytes` ring-equivalent bytes in all over n ranks."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        hops = 1 if op == "send" else STEPS[op](n)
        return calls * hops * link.latency + nbytes / link.bandwidth
