"""Markdown and HTML for the report: tables whose run ids link to the MLflow UI, embedded plots."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from steps.tables import fmt, to_markdown
from steps.tracking.describe import report_run_link

CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;"
    "padding:3px 7px;text-align:right}th{background:#f0f0f0}tr.failed,tr.missing{background:#fdd}"
    "tr.skipped{background:#ffd}img{max-width:100%}"
)
HEAD_COLUMNS = ["stage", "cells", "ok", "skipped", "failed/missing", "key number", "experiment_id", "run_id"]


def run_link(ui: str, exp: str, run_id: str) -> str:
    """The run's page, opened in MLflow's model-training view (the UI's default is its GenAI view)."""
    return report_run_link(exp, run_id, ui) if run_id else ""


def md_with_links(table: pd.DataFrame, ui: str) -> str:
    shown = table.drop(columns=["experiment_id"]).copy()
    shown["run_id"] = [
        f"[{r[:8]}]({run_link(ui, e, r)})" if r else "" for r, e in zip(table["run_id"], table["experiment_id"])
    ]
    return to_markdown(shown)


def html_table(table: pd.DataFrame, ui: str) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns if c != "experiment_id")
    body = []
    for _, row in table.iterrows():
        cells = []
        for c in table.columns:
            if c == "experiment_id":
                continue
            v = row[c]
            if c == "run_id" and v:
                cells.append(f'<td><a href="{run_link(ui, row["experiment_id"], v)}">{v[:8]}</a></td>')
            else:
                cells.append(f"<td>{html.escape(fmt(v))}</td>")
        body.append(f'<tr class="{html.escape(str(row.get("status", "")))}">{"".join(cells)}</tr>')
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def embed(png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return f'<p><img alt="{png.stem}" src="data:image/png;base64,{data}"></p>'


def stage_markdown(stage: str, table: pd.DataFrame, extra: dict[str, pd.DataFrame], figs: list[Path], ui: str) -> str:
    md = f"## {stage}\n\n" + md_with_links(table, ui)
    md += "".join(f"\n### {stage}: {name}\n\n{to_markdown(df)}" for name, df in extra.items())
    md += "".join(f"\n![{f.stem}](plots/{f.name})\n" for f in figs)
    return md


def stage_html(stage: str, table: pd.DataFrame, extra: dict[str, pd.DataFrame], figs: list[Path], ui: str) -> str:
    return (
        f"<h2 id='{stage}'>{stage}</h2>"
        + html_table(table, ui)
        + "".join(f"<h3>{stage}: {html.escape(n)}</h3>{df.to_html(index=False)}" for n, df in extra.items())
        + "".join(embed(f) for f in figs)
    )


def index_markdown(title: str, ui: str, head: pd.DataFrame, sections: list[str]) -> str:
    intro = (
        f"# {title}\n\nEvery row links to its MLflow run (serve the store with "
        f"`python -m steps.ui`, then open {ui}).\n\n"
    )
    return intro + "## Headline\n\n" + md_with_links(head, ui) + "\n" + "\n".join(sections)


def index_html(title: str, ui: str, head: pd.DataFrame, sections: list[str]) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1><h2>Headline</h2>"
        + html_table(head, ui)
        + "".join(sections)
        + "</body></html>"
    )
