"""A cell across several hosts ("nodes"): where each node's launcher learns its place, which
interface it talks on, which mesh axis crosses the host boundary, and which node it cannot reach.

Where a node learns (nnodes, node_rank, rdzv_endpoint), first match wins:
  config  the cell's `launch` (schema sharding.launch): nnodes > 1 or an rdzv_endpoint
  SLURM   the environment `srun` gives each task: SLURM_NNODES (or SLURM_JOB_NUM_NODES) > 1,
          SLURM_NODEID, the first host of SLURM_JOB_NODELIST as the rendezvous host, a port
          derived from SLURM_JOB_ID (two jobs sharing a first host do not collide), rdzv_id
          slurm-<job id>. Run one launcher per node: `srun --ntasks-per-node 1 python -m
          steps.sharding.launch --plan PLAN --out DIR` (one task per node; torchrun starts the
          node's ranks).
  else    one node (torchrun --standalone)
Node 0 hosts the rendezvous store: rdzv_endpoint must be an address of node 0.

Which mesh axis crosses the host boundary, with its bytes: links.py. Nothing here imports torch:
the launching job reads it too.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
from dataclasses import replace

from steps.sharding.plan_sections import Launch

SLURM_PORT_BASE = 29500  # + SLURM_JOB_ID % 1000


class NodesError(ValueError):
    """A multi-node launch that cannot start as configured (names the key and the fix)."""


# ---- where this node stands ---------------------------------------------------------------------
def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list, in order: "gpu[01-03,7],login-a" -> gpu01 gpu02 gpu03 gpu7 login-a
    (zero padding kept; several bracket groups, "r[1-2]n[1-2]", expand as a product)."""
    hosts, depth, start = [], 0, 0
    parts = []
    for i, ch in enumerate(nodelist + ","):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(nodelist[start:i].strip())
            start = i + 1
    for part in filter(None, parts):
        names = [""]
        for text, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", part):
            names = [n + text for n in names]
            if ranges:
                ids = []
                for r in ranges.split(","):
                    lo, _, hi = r.partition("-")
                    ids += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi or lo) + 1)]
                names = [n + i for n in names for i in ids]
        hosts += names
    return hosts


def from_slurm(env) -> dict:
    """{nnodes, node_rank, rdzv_endpoint, rdzv_id} from an `srun` task's environment, or {} outside
    a multi-node SLURM step."""
    nnodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
    if nnodes <= 1:
        return {}
    missing = [k for k in ("SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_JOB_ID") if not env.get(k)]
    if missing:
        raise NodesError(
            f"SLURM says {nnodes} nodes but {', '.join(missing)} is not set: start one launcher per node "
            "with `srun --ntasks-per-node 1 python -m steps.sharding.launch ...` (or set sharding.launch)"
        )
    first = expand_nodelist(env["SLURM_JOB_NODELIST"])[0]
    job = int(re.sub(r"\D", "", env["SLURM_JOB_ID"]) or 0)
    return {
        "nnodes": nnodes,
        "node_rank": int(env["SLURM_NODEID"]),
        "rdzv_endpoint": f"{first}:{SLURM_PORT_BASE + job % 1000}",
        "rdzv_id": f"slurm-{env['SLURM_JOB_ID']}",
    }


def resolve(launch: Launch, env=None) -> Launch:
    """The cell's `launch` with nnodes, node_rank, rdzv_endpoint filled in (see the module doc)."""
    env = os.environ if env is None else env
    out = launch
    if launch.nnodes == 1 and not launch.rdzv_endpoint:
        out = replace(launch, **from_slurm(env))
    nnodes, rank = out.nnodes, out.node_rank
    if nnodes > 1 and not out.rdzv_endpoint:
        raise NodesError(
            f"sharding.launch.nnodes {nnodes} needs rdzv_endpoint (host:port of node 0, e.g. 10.77.0.1:29400)"
        )
    if not 0 <= rank < nnodes:
        raise NodesError(f"sharding.launch.node_rank {rank} is outside 0..{nnodes - 1} (nnodes {nnodes})")
    return out


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise NodesError(f"sharding.launch.rdzv_endpoint {endpoint!r}: write host:port (e.g. 10.77.0.1:29400)")
    return host.strip("[]"), int(port)


def _ip(host: str) -> str:
    return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]


def route_to(host: str) -> tuple[str, str] | None:
    """(interface, this node's address) this node reaches `host` through: the interface whose subnet
    holds it (node 0 holds the endpoint itself), else the kernel's route. None where `ip` is missing
    or the host does not resolve (then gloo picks its interface from the hostname)."""
    try:
        target = ipaddress.ip_address(_ip(host))
        lines = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
        for m in re.finditer(r"^\d+:\s+(\S+)\s+inet\s+(\S+)", lines, re.M):
            iface = ipaddress.ip_interface(m[2])
            if target in iface.network and not iface.ip.is_loopback:
                return m[1].split("@")[0], str(iface.ip)
        route = subprocess.run(["ip", "-o", "route", "get", str(target)], capture_output=True, text=True).stdout
        dev, src = re.search(r"\bdev (\S+)", route), re.search(r"\bsrc (\S+)", route)
        return (dev[1], src[1]) if dev and src and dev[1] != "lo" else None
    except (OSError, ValueError, socket.gaierror):
        return None


def torchrun_args(launch: Launch) -> list[str]:
    """torchrun's multi-node arguments for this node; node 0 hosts the c10d store (is_host)."""
    host, _ = split_endpoint(launch.rdzv_endpoint)
    args = [
        "--nnodes",
        str(launch.nnodes),
        "--node_rank",
        str(launch.node_rank),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        launch.rdzv_endpoint,
        "--rdzv_id",
        str(launch.rdzv_id),
        "--rdzv_conf",
        f"is_host={int(launch.node_rank == 0)},join_timeout={int(float(launch.timeout_s))}",
    ]
    route = route_to(host)
    if route:  # MASTER_ADDR of the ranks = rank-0 node's --local_addr (its hostname would not route here)
        args += ["--local_addr", route[1]]
    return args


def rank_env(launch: Launch) -> dict:
    """The ranks' environment on this node: GLOO_SOCKET_IFNAME = the interface toward node 0 (unless
    the user set one), N00BGPT_NODE_ADDR/_RANK = this node's address on it and its configured rank
    (worker.exchange_peers; c10d numbers the nodes in its own order, GROUP_RANK, by address)."""
    route = route_to(split_endpoint(launch.rdzv_endpoint)[0])
    env = {"N00BGPT_NODE_ADDR": route[1] if route else "", "N00BGPT_NODE_RANK": str(launch.node_rank)}
    if route and not os.environ.get("GLOO_SOCKET_IFNAME"):
        env["GLOO_SOCKET_IFNAME"] = route[0]
    return env


def log_name(launch: Launch) -> str:
    """torchrun's log: node 0's keeps the one-node name; the others' do not clash on a shared disk."""
    node = launch.node_rank
    return "processes.log" if node == 0 else f"processes.node{node}.log"


# ---- which node cannot be reached ---------------------------------------------------------------
def write_peers(path, peers: list[dict]) -> None:
    """Every node's {node, addr} (all-gathered by the ranks after init): the launcher names an
    unreachable node from it. Written atomically: on a shared filesystem each node writes the same."""
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(peers, fh)
    os.replace(tmp, path)


def reachable(addr: str, port: int, timeout: float = 2.0) -> bool:
    """A TCP connect answers (accepted or refused: the host is there); silence or 'unreachable' not."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def diagnose(launch: Launch, peers_file) -> str:
    """Why a multi-node launch failed, as far as this node can see: the nodes it cannot reach."""
    host, port = split_endpoint(launch.rdzv_endpoint)
    me = launch.node_rank
    route = route_to(host)
    mine = route[1] if route else None
    try:
        peers = json.loads(open(peers_file).read())
    except (OSError, ValueError):
        peers = []
    if not peers:  # the rendezvous never completed: all this node knows is node 0's endpoint
        if me != 0 and not reachable(_safe_ip(host), port):
            return f"node 0 (rendezvous {host}:{port}) unreachable from node {me}"
        return f"the rendezvous at {host}:{port} did not complete (a node never joined)"
    lost = [p for p in peers if p["addr"] != mine and not reachable(p["addr"], port)]
    if not lost:
        return "every node answers (a rank failed or hung; see the log)"
    where = f"node {me}" + (f" ({mine})" if mine else "")
    return ", ".join(f"node {p['node']} ({p['addr']})" for p in lost) + f" unreachable from {where}"


def _safe_ip(host: str) -> str:
    try:
        return _ip(host)
    except OSError:
        return host
