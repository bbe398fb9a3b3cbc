"""A cell's metrics from its ranks' records: what the stage logs and what a node's launcher prints
(`python -m steps.sharding.launch`), so both read them the same way and neither imports the other."""

from __future__ import annotations

import statistics

from steps.sharding import links, parity


def summarize(plan, ranks: list[dict]) -> dict:
    """Cell metrics from every rank's record (parity: the worst over every rank, parity.verdict)."""
    r0 = ranks[0]
    steps = len(r0["step_s"])
    # a step ends when its slowest rank ends; skip step 0 (allocator / thread-pool warm-up)
    step_s = [max(r["step_s"][i] for r in ranks) for i in range(steps)]
    timed = step_s[1:] if steps > 1 else step_s
    per_sample = plan.gpt["block_size"] if plan.model == "gpt" else 1
    state = [sum(r["state_bytes"].values()) for r in ranks]
    comm = [statistics.mean(r["comm_bytes"]) for r in ranks]
    a = r0["analytic"]
    m = {
        "world": plan.world,
        "params": a["params"],
        **parity.verdict(ranks, plan.tolerance),
        "tokens_per_s": plan.batch_size * per_sample / statistics.median(timed),
        "step_s_median": statistics.median(timed),
        "state_bytes_rank_max": max(state),
        "state_bytes_analytic": a["state_bytes"],
        # worst rank against its own analytic (pipeline stages differ: embeddings vs head)
        "state_ratio": max((s / r["analytic"]["state_bytes"] for s, r in zip(state, ranks)), key=lambda x: abs(x - 1)),
        # bytes of each collective as issued (torch: at the dispatcher, JAX: in the compiled HLO), in the
        # analytic ring convention: they confirm collective counts and sizes, not bytes on the wire
        "dispatch_comm_bytes_step": statistics.mean(comm),
        "comm_bytes_analytic": a["comm_bytes"],
        "dispatch_comm_ratio": statistics.mean(comm) / a["comm_bytes"] if a["comm_bytes"] else float("nan"),
        "peak_rss_rank_max": max(r["peak_rss_bytes"] for r in ranks),
        "pipeline_bubble": plan.pipeline_bubble(),
        "max_inflight_microbatches": max(r.get("max_inflight", 0) for r in ranks),
    }
    m.update(state_split(plan, ranks))
    if "comm_groups" in r0:  # torch cells: bytes per mesh axis, and the link (intra- or inter-node) it uses
        local = r0.get("local_world", plan.world)
        link_m, m["links"] = links.per_link(plan.mesh, local, [r["comm_groups"] for r in ranks])
        m.update(link_m, nodes=max(plan.world // max(local, 1), 1))
    wire = [statistics.mean(r["wire_tx_bytes"]) for r in ranks if r.get("wire_tx_bytes")]
    if wire:  # multi-node: what each node's link interface sent per step (worker.wire_counter), summed
        sent = m["wire_tx_bytes_step"] = sum(wire)
        # against what a ring of the dispatched collectives would send across the nodes (links.per_link):
        # the excess is TCP/IP headers, the barriers and whatever gloo's own algorithms send beyond a ring
        crossing = m.get("dispatch_comm_crossing_bytes_step", 0.0)
        m["wire_over_dispatch_crossing"] = sent / crossing if crossing else float("nan")
    if "xb_dparam" in r0:  # JAX cells: the same plan in torch from the same weights and batch
        m["xbackend_max_dloss"], m["xbackend_max_dparam"] = r0["xb_dloss"], r0["xb_dparam"]
    return m


PARTS = ("params", "grads", "optim")


def state_split(plan, ranks: list[dict]) -> dict:
    """Each part of the state (params, grads, optimizer moments) on the fullest rank ÷ what one device
    holds of it (ZeRO-1: 1, 1, 1/N; ZeRO-2: 1, 1/N, 1/N; FSDP = ZeRO-3: 1/N each), and, where the
    analytic model gives the parts, the worst rank's measured ÷ analytic of each."""
    one = {"params": 1, "grads": 1, "optim": plan.state_tensors - 2}
    psi_bytes = ranks[0]["analytic"]["params"] * plan.bytes_per_elem
    out = {f"state_{k}_of_one_device": max(r["state_bytes"][k] for r in ranks) / (one[k] * psi_bytes) for k in PARTS}
    if "state_parts" in ranks[0]["analytic"]:
        for k in PARTS:
            ratios = [r["state_bytes"][k] / r["analytic"]["state_parts"][k] for r in ranks]
            out[f"state_{k}_ratio"] = max(ratios, key=lambda x: abs(x - 1))
    return out


def per_rank_table(ranks: list[dict]):
    import pandas as pd  # report-side only: a cell's job never needs it

    return pd.DataFrame(
        [
            {
                "rank": r["rank"],
                **{f"{k}_bytes": v for k, v in r["state_bytes"].items()},
                "dispatch_comm_bytes_step": statistics.mean(r["comm_bytes"]),
                "peak_rss_bytes": r["peak_rss_bytes"],
                "step_s_median": statistics.median(r["step_s"]),
            }
            for r in ranks
        ]
    )
