"""The saved runs-table view of each lab experiment, so that opening a stage in the MLflow UI shows its
numbers: the stage's headline metric and report metrics (steps/presentation/<stage>.py), the params
that tell its cells apart, sorted the way the stage reads (its baseline cell first, then by the
headline, best or worst first as the headline says).

MLflow (3.15+) keeps an experiment's saved views as experiment tags `mlflow.sharedViewState.<key>`; the
URL parameter `viewStateShareKey=<key>` opens one (describe.ui_url adds it to every experiment link).
3.17's UI reads the tag as an envelope `{"name", "createdAt", "updatedAt", "state"}` whose `state` is
the JSON of the runs page: its search facets (`orderByKey`, `orderByAsc`, `searchFilter`, ...) and UI
state (`selectedColumns` as "<metrics|params|tags|attributes>.`<key>`", ...); a bare state, as older
UIs wrote, is read too (mlflow/server/js: useSharedExperimentViewState, savedViews). The UI lists
the view by its name in the experiment's saved views.

MLflow sorts on one key, so "baseline first, then by the headline" is the run tag `view_order`, set
when a job ends (mlflow_run.py): "0 baseline", "1-<hex>" (the headline as an order-preserving hex
of the IEEE double, negated where larger reads first), "2" where the run has no headline number,
then ` | <cell>` (cells with equal headlines stay apart). A cell's seed runs carry its key and
` | seed <n>`, so they sort right under it: MLflow nests child runs only in a table sorted by start
time, so under this sort the seeds are the rows below their cell, named and tagged with it.
The view also orders the columns (`columnOrder`: the UI's fixed ones, then the stage's key columns) and
widens the name (`columnWidths`) so that a seed's name shows its cell and seed.
"""

from __future__ import annotations

import json
import struct
import time

from steps.presentation import presentation
from steps.tracking.describe import VIEW_KEY

TAG_PREFIX = "mlflow.sharedViewState."
ORDER_TAG = "view_order"
MAX_PARAMS = 8  # params beyond the stage's own columns: a screen's width
LAB_COLUMNS = [f"metrics.`jobs_{s}`" for s in ("ok", "failed", "killed", "skipped")] + [
    "tags.`git_commit`",
    "tags.`command`",
]


def column(ref: str) -> str:
    """'metrics.speedup' -> 'metrics.`speedup`', the runs table's column id."""
    kind, _, key = ref.partition(".")
    return f"{kind}.`{key}`"


def headline_metric(stage: str) -> tuple[str, bool] | None:
    """(metric key, larger first) of the stage's headline, if the headline is a logged metric."""
    try:
        shown = presentation(stage)
    except LookupError:  # not a stage of the lab (a run logged by hand under another name)
        return None
    if not shown.headline:
        return None
    ref = shown.columns.get(shown.headline[1], "")
    return (ref.partition(".")[2], shown.headline[2] == "max") if ref.startswith("metrics.") else None


def stage_columns(stage: str, params: list[str] = ()) -> list[str]:
    """The stage's view columns: cell and status, the headline, the params that tell the cells apart
    (the report's, then `params`: the keys its cells differ in, at most MAX_PARAMS of those), then the
    report's other metrics."""
    shown = presentation(stage)
    head = headline_metric(stage)
    refs = [f"metrics.{head[0]}"] if head else []
    refs += [r for r in shown.columns.values() if r.startswith("params.")]
    refs += [f"params.{p}" for p in params if f"params.{p}" not in refs][:MAX_PARAMS]
    refs += [r for r in shown.columns.values() if r.startswith("metrics.") and r not in refs]
    return ["tags.`cell`", "tags.`status`", *map(column, refs)]


NAME_COLUMN = "attributes.`Run Name`"  # the UI's fixed columns (ag-grid column ids of 3.17's runs table)
FIXED = ["attributes.`Run Name`", "runDateAndNestInfo", "duration"]  # Run Name, Created, Duration
NAME_WIDTH = 260  # px: "word2vec:sgd_perpair seed 1235" whole


def state(columns: list[str], order_by: str, ascending: bool) -> dict:
    return {
        "selectedColumns": columns,
        "columnOrder": [*FIXED, *columns],
        "columnWidths": {NAME_COLUMN: NAME_WIDTH},
        "orderByKey": order_by,
        "orderByAsc": ascending,
    }


def envelope(name: str, view: dict) -> str:
    """The tag value: the view under its name, as 3.17's UI stores a saved view."""
    now = int(time.time() * 1000)
    return json.dumps({"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(view)})


def stage_view(stage: str, params: list[str] = ()) -> dict:
    return state(stage_columns(stage, params), f"tags.`{ORDER_TAG}`", True)


def lab_view() -> dict:
    return state(LAB_COLUMNS, "attributes.start_time", False)


def current(exp, key: str = VIEW_KEY) -> dict | None:
    """The view state an experiment holds under `key` (the lab's; None: none, or unreadable)."""
    try:
        return json.loads(json.loads(exp.tags[TAG_PREFIX + key])["state"])
    except (KeyError, TypeError, ValueError):
        return None


def save(c, exp_id: str, view: dict, name: str, only_if_missing: bool = False, key: str = VIEW_KEY) -> None:
    """Write the view unless the experiment already holds the same (or any, `only_if_missing`) under `key`."""
    old = current(c.get_experiment(exp_id), key)
    if old == view or (only_if_missing and old is not None):
        return
    c.set_experiment_tag(exp_id, TAG_PREFIX + key, envelope(name, view))


def sweep_key(sweep: str) -> str:
    """The saved view of a sweep (`mcq_finetune.lr`): opened by `viewStateShareKey=<this>`."""
    return f"{VIEW_KEY}-sweep-{sweep}"


def sweep_view(stage: str, sweep: str) -> dict:
    """A sweep's runs (steps/config/sweep.py: tagged `sweep=<key>`, their seeds' runs nested under
    them) in value order, the value beside the stage's columns and its seed interval's ends."""
    cols = stage_columns(stage)
    head = headline_metric(stage)
    extra = [column(f"metrics.{head[0]}{end}") for end in ("_low", "_high")] if head else []
    chosen = [cols[0], "tags.`sweep_value`", *cols[1:3], *extra, "metrics.`seeds`", *cols[3:]]
    view = state(list(dict.fromkeys(chosen)), "tags.`sweep_order`", True)
    return {**view, "searchFilter": f"tags.sweep = '{sweep}'"}


def differing_params(runs) -> list[str]:
    """The params whose values differ between the latest run of each cell (the stage as it stands)."""
    latest = {}
    for r in sorted(runs, key=lambda r: r.info.start_time):
        latest[r.data.tags.get("cell", r.info.run_id)] = r.data.params
    keys = sorted({k for p in latest.values() for k in p})
    return [k for k in keys if len({p.get(k) for p in latest.values()}) > 1]


def refresh(c, exp_id: str, stage: str) -> None:
    """The stage's view with the params its cells differ in now (the job runs, not their children)."""
    runs = [
        r
        for r in c.search_runs([exp_id], max_results=1000)
        if r.data.tags.get("rule") and not r.data.tags.get("seed_of")  # a seed group's seeds are no jobs
    ]
    save(c, exp_id, stage_view(stage, differing_params(runs)), stage)


def sortable(x: float) -> str:
    """Hex of the IEEE double that sorts as text the way the numbers sort."""
    bits = struct.unpack(">Q", struct.pack(">d", x))[0]
    return f"{bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 1 << 63:016x}"


def order_key(stage: str, cell: str, metrics: dict[str, float]) -> str:
    """The run's `view_order` tag (module docstring)."""
    if cell == "baseline" or cell.endswith("_baseline"):
        return f"0 baseline | {cell}"
    head = headline_metric(stage)
    value = metrics.get(head[0]) if head else None
    if value is None or value != value:
        return f"2 no headline | {cell}"
    return f"1-{sortable(-value if head[1] else value)} {head[0]}={value:.4g} | {cell}"


def seed_order_key(cell_key: str, seed: int) -> str:
    """A seed run's `view_order`: its cell's, then the seed (sorted as a number)."""
    return f"{cell_key} | seed {seed:012d}"
