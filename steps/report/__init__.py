"""report: the DAG's final target — the comparison tables and plots people came for.

Which runs belong to this DAG is known exactly: the rule's inputs are every declared cell's
metrics.json (`--input <stage>/<cell>=<path>`), and each names its MLflow run id. Numbers are read
back from MLflow (`mlflow.search_runs`), so the report shows what the tracking store holds, and
every row links to its run. Declared cells that are missing, skipped or failed appear with their
reason; `<stage>.select` (or `--config`) narrows the tables with the matrix.

Each stage's section is shaped by its Stage object (steps/core/stage.py: columns, derived, headline,
curves, tables, figures), read from the stage's own module.

  gather.py   records, MLflow runs, one table per stage
  plots.py    learning curves from MLflow histories
  sweep.py    a swept knob's table and plot, outcome against value (config `sweep`)
  render.py   Markdown and HTML
  header.py   the header's date, commit, machine and command, from the runs' provenance
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from steps.core import StageRun
from steps.core.stage import Stage, presentation
from steps.presentation.report import SHOWN
from steps.report.config import ReportConfig
from steps.report.gather import fetch_runs, headline_row, load_cell, logged_tables, stage_table
from steps.report.header import provenance
from steps.report.plots import curve_figure
from steps.report.render import HEAD_COLUMNS, index_html, index_markdown, stage_html, stage_markdown
from steps.report.sweep import sweep_section
from steps.tracking import store


def cell_folders(ctx: StageRun, stages: dict[str, list[str]]) -> dict[str, dict[str, Path]]:
    """Each declared cell's folder: that of its metrics.json, the rule's `<stage>/<cell>` input."""
    return {s: {c: Path(ctx.inputs[f"{s}/{c}"]).parent for c in cells} for s, cells in stages.items()}


def run(ctx: StageRun) -> dict:
    p = ReportConfig.of(ctx.params)
    stages = {stage: stage_cells for stage, stage_cells in p.stages}  # DAG order
    ui = p.mlflow_ui_url
    out, plots = ctx.out, Path(ctx.outputs["plots"])
    plots.mkdir(parents=True, exist_ok=True)
    client = store.client(ctx.uri)
    folders = cell_folders(ctx, stages)
    records = {s: {c: load_cell(folders[s][c] / "metrics.json", s, c) for c in cells} for s, cells in stages.items()}
    run_ids = [rec.get("run_id") for recs in records.values() for rec in recs.values()]
    runs = fetch_runs(client, run_ids)

    heads, md_sections, html_sections = [], [], []
    counts = {"ok": 0, "skipped": 0, "failed": 0, "missing": 0}
    for stage in ctx.progress(stages, desc="report", total=len(stages)):
        spec = presentation(stage)  # steps/presentation/<stage>.py: no torch, JAX or transformers
        table = stage_table(records[stage], runs, spec, folders[stage])
        table.to_csv(out / f"{stage}.csv", index=False)
        status = table["status"].value_counts().to_dict()
        for k in counts:
            counts[k] += int(status.get(k, 0))
        heads.append(headline_row(stage, table, spec))
        figs = [f for f in [curve_figure(stage, table, list(spec.curves), client, plots)] if f]
        if spec.figures:
            figs += [Path(f) for f in spec.figures(table, plots, folders[stage]) or []]
        extra = logged_tables(folders[stage], spec.tables)
        md = stage_markdown(stage, table, extra, figs, ui)
        (out / f"{stage}.md").write_text(md)
        md_sections.append(md)
        html_sections.append(stage_html(stage, table, extra, figs, ui))
        for f in figs:
            ctx.log_artifact(f, "plots")
        ctx.log_artifact(out / f"{stage}.csv", "tables")

    if p.sweeps:  # a knob swept over values (steps/config/sweep.py): one table and one plot each
        md, htm, figs = sweep_section(p.sweeps, records, runs, out, plots, ui)
        md_sections.append(md)
        html_sections.append(htm)
        for f in [*figs, out / "sweep.csv"]:
            ctx.log_artifact(f, "plots" if f.suffix == ".png" else "tables")

    head = pd.DataFrame(heads)
    if head.empty:
        head = pd.DataFrame(columns=HEAD_COLUMNS)
    title = p.title
    index_md, index_htm = Path(ctx.outputs["index"]), Path(ctx.outputs["html"])
    facts = provenance(client, runs)  # date, commit, machine, command: from the runs, not this host
    index_md.write_text(index_markdown(title, ui, head, md_sections, facts))
    index_htm.write_text(index_html(title, ui, head, html_sections, facts))
    for path in (index_md, index_htm):
        ctx.log_artifact(path)
    return {f"cells_{k}": v for k, v in counts.items()}


STAGE = Stage.of(__spec__.name, run, SHOWN)
