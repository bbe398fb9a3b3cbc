"""Markdown and HTML for the report: tables whose run ids link to the MLflow UI, embedded plots."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from steps.report.gather import SEEDS
from steps.report.header import lines as header_lines
from steps.tables import fmt, to_markdown
from steps.tracking.describe import (
    COMPARE_PATH,
    FRAMED_LINKS,
    FRAMED_NOTE,
    LOCAL_UI,
    NEW_TAB,
    REPORT_PATH,
    report_run_link,
    ui_url,
)

UP = "../" * REPORT_PATH.count("/")  # from the report, as steps.ui serves it, up to the UI's address

CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
    "padding:3px 7px;text-align:left;vertical-align:top}th{background:#f0f0f0}"
    ".num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}"
    ".scroll{overflow-x:auto;max-width:100%;margin:1em 0}"  # a wide table scrolls in its own box
    # ... with its first column (the cell, or the stage) in view while it scrolls sideways
    "td.key,th.key{position:sticky;left:0;background:#fff;z-index:1;box-shadow:1px 0 0 #ccc}th.key{background:#f0f0f0}"
    "tr.failed,tr.missing{background:#fdd}tr.skipped{background:#ffd}img{max-width:100%}"
    "dl.meta{display:grid;grid-template-columns:max-content auto;gap:2px 1em}dl.meta dd{margin:0}"
    ".note{background:#ffd;border:1px solid #ec9;padding:6px 10px}"
)
HEAD_COLUMNS = ["stage", "cells", "ok", "skipped", "failed/missing", "key number", "experiment_id", "run_id"]
KEYS = ("cell", "stage", "value")  # a table's first column, kept in view (the headline's, a stage's, a sweep's)
RUN = "run"  # the run link's column, next to the key column
LONG = 80  # characters a cell shows; a longer text is cut, with the whole of it as the cell's tooltip


def run_link(ui: str, exp: str, run_id: str) -> str:
    """The run's page, opened in MLflow's model-training view (the UI's default is its GenAI view)."""
    return report_run_link(exp, run_id, ui) if run_id else ""


def with_seed_intervals(table: pd.DataFrame) -> pd.DataFrame:
    """A seed group's columns as one cell each, "mean [low, high] (n seeds)" (gather.SEEDS: the
    table keeps the interval beside the mean for the CSV); a cell of one seed beside them keeps its
    value alone."""
    out = table.copy()
    for c in [c for c in table.columns if str(c).endswith(SEEDS)]:
        base = c.removesuffix(SEEDS)
        if base in out:
            out[base] = [
                f"{fmt(v, markdown=False)} {iv}" if isinstance(iv, str) and iv and fmt(v) else v
                for v, iv in zip(out[base], out[c])
            ]
        out = out.drop(columns=[c])
    return out


def md_with_links(table: pd.DataFrame, ui: str) -> str:
    table = with_seed_intervals(table)
    shown = table[first_columns([c for c in table.columns if c != "experiment_id"])].copy()
    shown["run_id"] = [
        f"[{r[:8]}]({run_link(ui, e, r)})" if r else "" for r, e in zip(table["run_id"], table["experiment_id"])
    ]
    return to_markdown(shown)


def is_numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numeric_columns(table: pd.DataFrame) -> set:
    """Columns whose filled cells are all numbers: right-aligned (text stays left)."""
    out = set()
    for c in table.columns:
        filled = [v for v in table[c] if fmt(v, markdown=False) != ""]
        if filled and all(is_numeric(v) for v in filled):
            out.add(c)
    return out


def first_columns(columns: list) -> list:
    """The leading key columns (the cell, or the stage; a sweep's value and cell), then the run link,
    then the others as they come: a row's name and its link stay at the left of a table that scrolls
    sideways."""
    lead = next((i for i, c in enumerate(columns) if c not in KEYS), len(columns))
    key, run = list(columns[:lead]), ["run_id"] if "run_id" in columns else []
    return key + run + [c for c in columns if c not in key and c not in run]


def text_cell(text: str, attr: str = "") -> str:
    """A text cell cut at LONG characters (the row stays one or two lines high), the whole of it
    shown as the cell's tooltip."""
    if len(text) <= LONG:
        return f"<td{attr}>{html.escape(text)}</td>"
    return f'<td{attr} title="{html.escape(text)}">{html.escape(text[: LONG - 1].rstrip())}…</td>'


def html_table(table: pd.DataFrame, ui: str = "") -> str:
    """An HTML table in its own scrolling box: the key column (kept in view) and the run link first,
    numbers right-aligned, text left and cut at LONG characters."""
    table = with_seed_intervals(table)
    shown = first_columns([c for c in table.columns if c != "experiment_id"])
    num = numeric_columns(table)

    def attr(c) -> str:
        classes = " ".join(k for k, on in (("key", c == shown[0] and c in KEYS), ("num", c in num)) if on)
        return f' class="{classes}"' if classes else ""

    head = "".join(f"<th{attr(c)}>{html.escape(RUN if c == 'run_id' else str(c))}</th>" for c in shown)
    body = []
    for _, row in table.iterrows():
        cells = []
        for c in shown:
            v = row[c]
            if c == "run_id" and v and "experiment_id" in table:
                link = html.escape(run_link(ui, row["experiment_id"], v))
                cells.append(f'<td><a href="{link}" {NEW_TAB}>{v[:8]}</a></td>')
            else:
                cells.append(text_cell(fmt(v, markdown=False), attr(c)))
        body.append(f'<tr class="{html.escape(str(row.get("status", "")))}">{"".join(cells)}</tr>')
    return f"<div class='scroll'><table><tr>{head}</tr>{''.join(body)}</table></div>"


def experiment_link(table: pd.DataFrame, ui: str) -> str:
    """The stage's experiment in the UI, opened on its saved view (steps/tracking/views.py)."""
    exps = [e for e in table.get("experiment_id", []) if e]
    return report_run_link(exps[0], None, ui) if exps else ""


def embed(png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return f'<p><img alt="{png.stem}" src="data:image/png;base64,{data}"></p>'


def stage_markdown(stage: str, table: pd.DataFrame, extra: dict[str, pd.DataFrame], figs: list[Path], ui: str) -> str:
    link = experiment_link(table, ui)
    md = f"## {stage}\n\n" + (f"[All runs in MLflow]({link})\n\n" if link else "") + md_with_links(table, ui)
    md += "".join(f"\n### {stage}: {name}\n\n{to_markdown(df)}" for name, df in extra.items())
    md += "".join(f"\n![{f.stem}](plots/{f.name})\n" for f in figs)
    return md


def stage_html(stage: str, table: pd.DataFrame, extra: dict[str, pd.DataFrame], figs: list[Path], ui: str) -> str:
    link = experiment_link(table, ui)
    return (
        f"<h2 id='{html.escape(stage)}'>{html.escape(stage)}</h2>"
        + (f'<p><a href="{html.escape(link)}" {NEW_TAB}>All runs in MLflow</a></p>' if link else "")
        + html_table(table, ui)
        + "".join(f"<h3>{html.escape(stage)}: {html.escape(n)}</h3>{html_table(df)}" for n, df in extra.items())
        + "".join(embed(f) for f in figs)
    )


def index_markdown(title: str, ui: str, head: pd.DataFrame, sections: list[str], facts: dict | None = None) -> str:
    """index.md: title, provenance, contents, the headline table, every stage's section."""
    meta = "".join(f"- **{label}**: {value}\n" for label, value in header_lines(facts or {}))
    stages = [s.split("\n", 1)[0].removeprefix("## ") for s in sections]
    toc = " · ".join(f"[{s}](#{s.lower()})" for s in ["Headline", *stages])
    intro = f"# {title}\n\n{meta}\n{links_hint(ui)}\n\n**Contents**: {toc}\n\n"
    return intro + "## Headline\n\n" + md_with_links(head, ui) + "\n" + "\n".join(sections)


def links_hint(ui: str) -> str:
    """Where the report's run links open (index.md's line under its header)."""
    if ui:
        return f"Every row links to its MLflow run at {ui} (serve the store there with `python -m steps.ui`)."
    return (
        "Every row links to its MLflow run, relative to the report as `python -m steps.ui` serves it: run "
        "`python -m steps.ui`, which prints the report's address beside the UI's "
        f"(`{LOCAL_UI}/{REPORT_PATH}index.html` by default), and open the report there."
    )


def open_note(ui: str) -> str:
    """index.html's first line: where its run links open, shown until the page is one where they do
    (served by steps.ui, or MLflow's artifact view); opened as a file, its links relative to the UI (runs,
    experiments, the compare page) point at steps.ui's default address instead of a directory listing."""
    if ui:
        text = f"Run links open the MLflow UI at <code>{html.escape(ui)}</code>: serve the store there with"
        text += " <code>python -m steps.ui</code>."
    else:
        text = (
            "Run links open the MLflow UI: run <code>python -m steps.ui</code>, which serves this report "
            "beside the UI and prints its address, and open the report there "
            f"(<code>{LOCAL_UI}/{REPORT_PATH}index.html</code> by default)."
        )
    script = (
        "<script>(function(){var n=document.getElementById('n00bgpt-open'),p=location.protocol,rel=%(rel)s;"
        "if(p==='blob:'||(rel&&/^https?:$/.test(p)&&location.pathname.indexOf(%(path)r)>=0)){n.remove();return}"
        "if(p!=='file:'||!rel)return;"
        "n.insertAdjacentHTML('beforeend',' Opened as a file, as now, its run links point at <code>'+%(ui)r+"
        "'</code>, the UI\\'s address when it runs with its default port.');"
        "document.addEventListener('DOMContentLoaded',function(){document.querySelectorAll('a[href]').forEach("
        "function(a){var h=a.getAttribute('href');"
        "if(h.indexOf(%(up)r)===0)a.setAttribute('href',%(ui)r+'/'+h.slice(%(n)d))})})})();</script>"
    ) % {"rel": "false" if ui else "true", "path": "/" + REPORT_PATH, "ui": LOCAL_UI, "up": UP, "n": len(UP)}
    return f"<p class='note' id='n00bgpt-open'>{text}</p>{script}"


def ui_links(ui: str) -> str:
    """The report's way back into the MLflow UI: its experiment list, and the page that compares two lab
    runs (steps/ui_compare.py; each lab run's description links this report)."""
    base = ui or UP
    compare = f"{base.rstrip('/')}/{COMPARE_PATH}" if ui else base + COMPARE_PATH
    return (
        f'<p>In the MLflow UI: <a href="{html.escape(ui_url(base))}" {NEW_TAB}>every experiment</a> · '
        f'<a href="{html.escape(compare)}" {NEW_TAB}>two lab runs side by side</a></p>'
    )


def index_html(title: str, ui: str, head: pd.DataFrame, sections: list[str], facts: dict | None = None) -> str:
    """index.html: the same, with a table of contents and the wide tables scrolling in their boxes; a
    note at the top says where its run links open (open_note), and each opens in a new tab."""
    meta = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in header_lines(facts or {}))
    stages = [s.split("id='", 1)[1].split("'", 1)[0] for s in sections]
    toc = "".join(f"<li><a href='#{s}'>{s}</a></li>" for s in ["headline", *stages])
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>{FRAMED_NOTE}{open_note(ui)}<h1>{html.escape(title)}</h1>"
        f"<dl class='meta'>{meta}</dl>{ui_links(ui)}"
        f"<nav><b>Contents</b><ul>{toc}</ul></nav><h2 id='headline'>Headline</h2>"
        + html_table(head, ui)
        + "".join(sections)
        + FRAMED_LINKS
        + "</body></html>"
    )
