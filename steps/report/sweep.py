"""The report's `sweep` section (steps/config/sweep.py): per swept knob one table, one row per value
in value order (the value, each outcome as `mean [low, high] (n seeds)`, the run), and one plot of
the stage's headline outcome against the value with its seed interval as error bars (a log x axis
where the values are positive numbers spanning more than 10×; values that are no numbers stand side
by side in their order).

The outcomes: the stage's headline column (steps/presentation/<stage>.py) where it is a metric, then
every other `metrics.` column that some sweep cell holds a seed interval of (an outcome the seed
moves; a timing stays the first seed's and has none, steps/core/seeds.py). Numbers are read as the
stage tables read them (steps/report/gather.py: MLflow, metrics.json as fallback).
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import pandas as pd

from steps.config.sweep import is_number, value_text
from steps.core.seeds import Interval
from steps.core.stage import Presentation, presentation
from steps.report.gather import lookup
from steps.report.plots import plt
from steps.report.render import embed, html_table, md_with_links
from steps.tables import fmt
from steps.tracking.describe import NEW_TAB, VIEW_QUERY, report_run_link
from steps.tracking.views import sweep_key

TITLE = "sweep"
LOG_SPAN = 10.0  # values spanning more than this factor (all > 0) are plotted on a log axis


def outcomes(spec: Presentation, records: list[dict]) -> dict[str, str]:
    """{column title: metric key} the sweep's table shows (module docstring), the headline first."""
    metrics = {t: ref.partition(".")[2] for t, ref in spec.columns.items() if ref.startswith("metrics.")}
    head = spec.headline[1] if spec.headline and spec.headline[1] in metrics else None
    spread = [r.get("metrics") or {} for r in records]
    varied = [t for t, k in metrics.items() if any(m.get(f"{k}_sd") is not None for m in spread)]
    chosen = [t for t in [head, *varied] if t] or list(metrics)[:1]
    return {t: metrics[t] for t in dict.fromkeys(chosen)}


def interval_of(key: str, rec: dict, run) -> Interval | None:
    """The outcome's mean and seed interval (Interval), or None where the cell has no value."""
    mean = lookup(f"metrics.{key}", rec, run)
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return None
    low, high, sd = (lookup(f"metrics.{key}{end}", rec, run) for end in ("_low", "_high", "_sd"))
    n = int(lookup("metrics.seeds", rec, run) or 1)
    if low is None or high is None or sd is None:
        return Interval(float(mean), None, None, None, n)
    return Interval(float(mean), float(sd), float(low), float(high), n)


def interval_text(iv: Interval | None) -> str:
    """'mean [low, high] (n seeds)'; a group whose seeds all gave the same: 'v (n seeds, all alike)'."""
    if iv is None:
        return ""
    if not iv.decided and iv.n > 1:
        return f"{fmt(iv.mean, markdown=False)} ({iv.n} seeds, all alike)"
    return iv.text(lambda v: fmt(v, markdown=False))


def sweep_table(sweep: dict, records: dict[str, dict], runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    """(the shown table, the numbers behind it: value, cell, status, each outcome's mean, low, high,
    seeds, run; the outcomes' titles, the plotted one first) of one sweep, in value order."""
    spec = presentation(sweep["stage"])
    recs = [records.get(cell) or {} for cell, _ in sweep["cells"]]
    chosen = outcomes(spec, recs)
    shown, raw = [], []
    for (cell, value), rec in zip(sweep["cells"], recs):
        run_id = rec.get("run_id") or ""
        run = runs.loc[run_id] if run_id and len(runs) and run_id in runs.index else None
        row = {"value": value_text(value), "cell": cell, "status": rec.get("status", "missing")}
        numbers = {"sweep": sweep["sweep"], "value": value, "cell": cell, "status": row["status"]}
        for title, key in chosen.items():
            iv = interval_of(key, rec, run) if rec.get("status") == "ok" else None
            row[title] = interval_text(iv)
            numbers |= {title: iv.mean if iv else None, f"{title} low": iv.low if iv else None}
            numbers |= {f"{title} high": iv.high if iv else None, f"{title} seeds": iv.n if iv else None}
        row["reason"] = rec.get("reason", "") if rec.get("status") != "ok" else ""
        row |= {"experiment_id": rec.get("experiment_id") or "", "run_id": run_id}
        numbers["run_id"] = run_id
        shown.append(row)
        raw.append(numbers)
    table = pd.DataFrame(shown)
    if not table["reason"].astype(bool).any():
        table = table.drop(columns=["reason"])
    return table, pd.DataFrame(raw), list(chosen)


def sweep_figure(sweep: dict, raw: pd.DataFrame, outcome: str, out: Path) -> Path | None:
    """The outcome against the value, each point's seed interval as its error bar."""
    ok = raw[pd.to_numeric(raw[outcome], errors="coerce").notna()]
    if ok.empty:
        return None
    values = list(ok["value"])
    numeric = all(is_number(v) for v in values)
    x = [float(v) for v in values] if numeric else list(range(len(values)))
    y = ok[outcome].astype(float).tolist()
    low = [m - lo if pd.notna(lo) else 0.0 for m, lo in zip(y, ok[f"{outcome} low"])]
    high = [hi - m if pd.notna(hi) else 0.0 for m, hi in zip(y, ok[f"{outcome} high"])]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=4, linestyle="-")
    for xi, yi, n in zip(x, y, ok[f"{outcome} seeds"]):
        label = f"{int(n)} seed{'s' if n != 1 else ''}"
        ax.annotate(label, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if numeric and min(x) > 0 and max(x) / min(x) > LOG_SPAN:
        ax.set_xscale("log")
    if not numeric:
        ax.set_xticks(x, [value_text(v) for v in values])
    ax.set_xlabel(f"{sweep['stage']}: {sweep['knob']}")
    ax.set_ylabel(outcome)
    ax.set_title(f"sweep {sweep['sweep']}: {outcome}\n(mean over seeds, bars: 95 % interval over seeds)", fontsize=9)
    path = out / f"sweep_{re.sub(r'[^A-Za-z0-9_.-]+', '-', sweep['sweep'])}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def view_link(table: pd.DataFrame, sweep: str, ui: str) -> str:
    """The stage's experiment in the UI, opened on the sweep's saved view (steps/tracking/views.py)."""
    exps = [e for e in table.get("experiment_id", []) if e]
    if not exps:
        return ""
    return report_run_link(exps[0], None, ui).replace(VIEW_QUERY, f"viewStateShareKey={sweep_key(sweep)}")


def sweep_section(sweeps, records: dict[str, dict[str, dict]], runs: pd.DataFrame, out: Path, plots: Path, ui: str):
    """(Markdown, HTML, [plots]) of the report's `sweep` section; writes `sweep.csv` and `sweep.md`
    beside the stage tables."""
    md, htm, figs, frames = [f"## {TITLE}\n"], [f"<h2 id='{TITLE}'>{TITLE}</h2>"], [], []
    for sweep in sweeps:
        table, raw, chosen = sweep_table(sweep, records.get(sweep["stage"], {}), runs)
        frames.append(raw)
        fig = sweep_figure(sweep, raw, chosen[0], plots) if chosen else None
        figs += [fig] if fig else []
        base = f"the cell `{sweep['base']}`" if sweep["base"] != "main" else "its section"
        what = f"`{sweep['stage']}.{sweep['knob']}` over {len(sweep['cells'])} values, on {base}"
        link = view_link(table, sweep["sweep"], ui)
        md.append(
            f"\n### {sweep['sweep']}\n\n{what} (MLflow: runs tagged `sweep = '{sweep['sweep']}'`"
            + (f", [the sweep's view]({link})" if link else "")
            + ").\n\n"
            + md_with_links(table, ui)
            + (f"\n![{fig.stem}](plots/{fig.name})\n" if fig else "")
        )
        htm.append(
            f"<h3>{html.escape(sweep['sweep'])}</h3><p>{html.escape(what.replace('`', ''))} (MLflow: runs tagged "
            f"<code>sweep = '{html.escape(sweep['sweep'])}'</code>"
            + (f', <a href="{html.escape(link)}" {NEW_TAB}>the sweep\'s view</a>' if link else "")
            + ").</p>"
            + html_table(table, ui)
            + (embed(fig) if fig else "")
        )
    numbers = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    numbers.to_csv(out / f"{TITLE}.csv", index=False)
    (out / f"{TITLE}.md").write_text("".join(md))
    return "".join(md), "".join(htm), figs
