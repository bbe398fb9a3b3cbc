"""Which link each mesh axis uses across nodes, and the bytes it carries (nodes.py places the nodes).

Ranks are node-major (torchrun: rank = node * local world + local rank) and the mesh is rank-major
(init_device_mesh: outer axis first), so on 2 nodes × 2 ranks a mesh {fsdp: 2, tp: 2} keeps tp inside
a node and runs fsdp across the link. Input: every rank's comm.CommCounter.groups (bytes per group of
global ranks, worker.py's comm_groups). Pure Python.
"""

from __future__ import annotations


def axis_of(mesh: dict, ranks) -> str:
    """The mesh axes a process group spans ("fsdp", "tp", "fsdp×tp" for the whole 2-D world)."""
    sizes = list(mesh.values()) or [1]
    coords = [_unravel(r, sizes) for r in ranks]
    names = list(mesh) or ["world"]
    varying = [names[i] for i in range(len(sizes)) if len({c[i] for c in coords}) > 1]
    return "×".join(varying) or "self"


def _unravel(rank: int, sizes: list[int]) -> list[int]:
    out = []
    for s in reversed(sizes):
        out.append(rank % s)
        rank //= s
    return out[::-1]


def link_of(ranks, local_world: int) -> str:
    return "inter-node" if len({r // local_world for r in ranks}) > 1 else "intra-node"


def per_link(mesh: dict, local_world: int, ranks_groups: list[dict]) -> tuple[dict, str]:
    """Per-step bytes each rank sends per mesh axis (mean over ranks, analytic.py's ring convention, as the
    collectives were dispatched: not bytes on the wire),
    with the link the axis uses: (metrics, "fsdp inter-node 12.0 KiB; tp intra-node 3.0 KiB").
    `ranks_groups`: per rank, in rank order, {"0,2": bytes sent on the group of ranks 0 and 2} of one step."""
    local = max(local_world, 1)
    by_axis: dict[str, list] = {}
    crossing = 0.0  # the ring model: each rank sends a group's bytes to its successor in the group
    for me, groups in enumerate(ranks_groups):
        for key, sent in groups.items():
            ranks = [int(r) for r in key.split(",")]
            if me in ranks and ranks[(ranks.index(me) + 1) % len(ranks)] // local != me // local:
                crossing += sent
            slot = by_axis.setdefault(axis_of(mesh, ranks), [0.0, link_of(ranks, local)])
            slot[0] += sent / len(ranks_groups)
            if link_of(ranks, local) == "inter-node":
                slot[1] = "inter-node"
    metrics = {f"dispatch_comm_bytes_step_{axis.replace('×', '_')}": b for axis, (b, _) in by_axis.items()}
    metrics["dispatch_comm_inter_node_bytes_step"] = sum(b for b, link in by_axis.values() if link == "inter-node")
    metrics["dispatch_comm_intra_node_bytes_step"] = sum(b for b, link in by_axis.values() if link == "intra-node")
    # all ranks together: what a ring sends across the node boundary (a group of 4 ranks on 2 nodes
    # crosses on 2 of its 4 ring edges), the count the bytes on the wire are held against
    metrics["dispatch_comm_crossing_bytes_step"] = crossing
    text = "; ".join(f"{axis} {link} {b / 1024:.1f} KiB" for axis, (b, link) in sorted(by_axis.items()))
    return metrics, text
