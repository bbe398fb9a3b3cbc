"""`--skip-done LEDGER`: a second device call runs only what the first did not finish ok.

The first call's ledger (its --out/campaign.json, which the device call brings back) embeds every
finished cell's own record. The cells ok there are carried into this call's ledger as they were
(marked `carried`, with the call they came from), and their metrics.json is restored in the work
folder, so that the cells that need one (a perf cell's baseline) and the report find it; every
other cell runs. A cell whose output is a data folder (the corpus, the tokenizer) cannot be
restored from a record: it runs again when a cell that needs it runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from steps.campaign.plan import Cell
from steps.config import ConfigError


def load_done(path: Path) -> tuple[str, dict[str, dict]]:
    """(where they come from, {cell: ledger entry}) of the cells ok in an earlier call's ledger."""
    try:
        ledger = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--skip-done {path}: not a campaign ledger ({exc}); give the first call's campaign.json")
    if not isinstance(ledger, dict) or "cells" not in ledger:
        raise ConfigError(f"--skip-done {path}: no `cells` in it; give the first call's campaign.json")
    source = f"{ledger.get('started_utc', '?')}, commit {ledger.get('commit', '?')}"
    done = {n: e for n, e in ledger["cells"].items() if e.get("status") == "ok" and e.get("record")}
    return source, done


def same_config(c: Cell, record: dict) -> bool:
    """Whether the earlier record ran the config this plan gives the cell (a ladder reordered
    since keeps its cell names, t1024_ladder_<step>, for other stacks of changes)."""
    ran = (record.get("info") or {}).get("params")
    if not isinstance(ran, dict):
        return True  # a stage whose record keeps no params: the name decides
    return all(ran[k] == v for k, v in c.params.items() if k in ran)


def carry_done(plan: list[Cell], done: dict[str, dict], work: Path, ledger, source: str) -> list[str]:
    """Mark the plan's cells that `done` holds as carried in `ledger` and restore their records
    under `work`; returns their names. Walks the plan backwards: a data cell is carried only when
    no cell that will run needs it (chains: the tokenizer needs the corpus)."""
    runs: set[str] = set()
    carried: list[Cell] = []
    for c in reversed(plan):
        if c.skip:
            continue
        needed = "data" in c.outputs and any(c.name in d.after for d in plan if d.name in runs)
        if c.name in done and not needed and same_config(c, done[c.name]["record"]):
            carried.append(c)
        else:
            runs.add(c.name)
    for c in carried:
        entry = done[c.name]
        path = work / c.metrics
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entry["record"], indent=1))
        kept = {k: entry[k] for k in ("status", "reason", "seconds", "record") if k in entry}
        ledger.set(c, **kept, carried=source)
    return [c.name for c in reversed(carried)]
