"""The HTML report reads itself: numbers right-aligned and text left, no Markdown escapes in HTML,
wide tables scrolling in their own box, a table of contents, a header with date, commit and machine
from the runs' provenance (a real SQLite store), perf curves in distinct colours without the compile
step, and descriptions whose `__main__` stays literal."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pandas as pd
import pytest

from steps.report.gather import fetch_runs
from steps.report.header import provenance
from steps.report.plots import WARM_UP, line_style, points
from steps.report.render import html_table, index_html, index_markdown, stage_html, stage_markdown
from steps.tracking import jobs, lab, store
from steps.tracking.describe import FRAMED_LINKS, FRAMED_NOTE, LOCAL_UI, md_escape, stage_description, ui_url

TABLE = pd.DataFrame(
    {
        "cell": ["baseline", "a|b"],
        "status": ["ok", "ok"],
        "tokens/s": [1234.0, 99.5],
        "vs baseline": ["1.01x [0.97, 1.05] (20 pairs)", ""],
        "experiment_id": ["3", "3"],
        "run_id": ["0123456789abcdef", ""],
    }
)


def test_numbers_right_text_left_no_escapes_and_a_scroll_box():
    page = html_table(TABLE, "http://ui")
    assert "\\|" not in page and '<td class="key">a|b</td>' in page
    assert '<th class="num">tokens/s</th>' in page and '<td class="num">1,234</td>' in page
    assert "<th>vs baseline</th>" in page and "<td>1.01x [0.97, 1.05] (20 pairs)</td>" in page
    assert page.startswith("<div class='scroll'><table>") and page.endswith("</table></div>")


def test_index_has_header_contents_and_stage_links():
    facts = {"date": "2026-11-26 15:00 UTC", "commit": "abc1234", "machine": "Xeon, 2 cores, 24.0 GiB, GPU: none"}
    sections = [stage_html("perf", TABLE, {"memory": TABLE[["cell", "tokens/s"]]}, [], "http://ui")]
    page = index_html("n00bGPT lab", "http://ui", TABLE, sections, facts)
    assert "<nav><b>Contents</b><ul><li><a href='#headline'>headline</a></li><li><a href='#perf'>perf</a>" in page
    assert "<dt>git commit</dt><dd>abc1234</dd>" in page and "<dt>machine</dt><dd>Xeon, 2 cores" in page
    assert "viewStateShareKey=" in page and page.count("<div class='scroll'>") == 3
    md = index_markdown("n00bGPT lab", "http://ui", TABLE, [stage_markdown("perf", TABLE, {}, [], "http://ui")], facts)
    assert "- **runs ended**: 2026-11-26 15:00 UTC\n" in md
    assert "**Contents**: [Headline](#headline) · [perf](#perf)" in md
    assert [ln for ln in md.splitlines() if ln.startswith("## ")] == ["## Headline", "## perf"]  # as steps.record reads


def test_header_comes_from_the_runs_provenance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    lab_id = lab.start(uri, {"seed": 1}, "snakemake --cores 2")
    c = store.client(uri)
    exp = store.experiment_id(c, "perf", uri)
    tags = {"mlflow.parentRunId": lab_id, "git_commit": "feedbee", "host": "node7", "stage": "perf"}
    run = c.create_run(exp, tags=tags)
    c.set_terminated(run.info.run_id, "FINISHED")
    lab_tags = c.get_run(lab_id).data.tags
    facts = provenance(c, fetch_runs(c, [run.info.run_id]))
    assert facts["commit"] == "feedbee" and facts["hosts"] == "node7" and facts["command"] == "snakemake --cores 2"
    assert facts["machine"].startswith(f"{lab_tags['machine.cpu']}, {lab_tags['machine.cores']} cores")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", facts["date"])


def test_sixteen_cells_get_sixteen_lines_apart():
    styles = [tuple(sorted(line_style(i).items())) for i in range(16)]
    assert len(set(styles)) == 16 and len({dict(s)["color"] for s in styles}) == 16
    assert len(set(tuple(sorted(line_style(i).items())) for i in range(40))) == 40


def test_step_time_curve_leaves_out_the_compile_step(tmp_path):
    c = store.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = c.create_run(c.create_experiment("e")).info.run_id
    for step, (ms, loss) in enumerate([(9000.0, 5.0), (12.0, 4.0), (11.0, 3.5), (12.5, 3.2)]):
        c.log_metric(run_id, "step_time_ms", ms, step=step)
        c.log_metric(run_id, "train_loss", loss, step=step)
    assert points(c, run_id, "step_time_ms") == ([1, 2, 3], [12.0, 11.0, 12.5]) and WARM_UP == 1
    assert points(c, run_id, "train_loss")[0] == [0, 1, 2, 3]


@pytest.mark.parametrize("text", ["see __main__.py", "a *b* c", "__init__"])
def test_markdown_escaped_outside_code(text):
    assert not re.search(r"(?<!\\)(__|\*)\w", md_escape(text))
    assert md_escape(f"`{text}` gpt_train") == f"`{text}` gpt_train"


def test_perf_description_keeps_main_literal():
    desc = stage_description("steps.perf")
    assert "\\_\\_main\\_\\_.py" in desc and " __main__" not in desc


class Links(HTMLParser):
    """Every <a> of a page with its attributes, and the page's visible text before its first table."""

    def __init__(self, page: str):
        super().__init__()
        self.links, self.top, self.tables, self.hidden, self.skip = [], [], 0, 0, 0
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a":
            self.links.append(attrs)
        self.tables += tag == "table"
        self.skip += tag in ("script", "style") or "display:none" in (attrs.get("style") or "")

    def handle_endtag(self, tag):
        if tag in ("script", "style") or (tag == "p" and self.skip):
            self.skip = max(0, self.skip - 1)

    def handle_data(self, data):
        if not self.tables and not self.skip:
            self.top.append(data)


def leaving_links(page: str) -> list[dict]:
    """The page's links to other pages (all but its in-page contents, `#stage`), each asserted to open a
    new tab: MLflow's artifact view frames the page in a sandbox that may not navigate its top window."""
    links = Links(page).links
    out = [a for a in links if not a["href"].startswith("#")]
    assert out and all(a["href"].startswith("#") for a in links if a not in out)
    for a in out:
        assert a.get("target") == "_blank" and "noopener" in a.get("rel", "").split(), a
    return out


def test_every_run_link_in_the_html_artifacts_opens_a_new_tab():
    """jobs.html (the lab run's artifact) and the report's index.html: no `target=_top`, which MLflow's
    sandboxed artifact frame refuses, and no link that would replace the page; in that frame a click is
    handed to MLflow's page to open (describe.FRAMED_LINKS, mlflow_app.OPEN_LINKS_SCRIPT)."""
    rows = [jobs.Job("perf", "a", "ok", link=ui_url("", "3", "0123456789abcdef")), jobs.Job("perf", "b", "failed")]
    page = jobs.html_page(rows, "lab run x: 2 jobs")
    assert [a["href"] for a in leaving_links(page)] == [ui_url("", "3", "0123456789abcdef")]
    assert "_top" not in page and FRAMED_LINKS in page and FRAMED_NOTE in page
    sections = [stage_html("perf", TABLE, {"memory": TABLE}, [], "")]
    report = index_html("n00bGPT lab", "", TABLE, sections, {})
    hrefs = [a["href"] for a in leaving_links(report)]
    assert hrefs[0] == "../../#/experiments?workflowType=machine_learning"  # the UI's experiment list
    assert hrefs[1] == "../../lab/compare"  # two lab runs side by side (steps/ui_compare.py)
    assert len(hrefs) == 6 and all(h.startswith("../../#/experiments/3") for h in hrefs[2:])  # runs + "All runs"
    assert FRAMED_LINKS in report and report.index(FRAMED_LINKS) > report.rindex("</table>")  # after the links


def test_the_report_says_where_its_run_links_open():
    """Opened as a file (what a double-click does), index.html says at its top, before any table, that
    the links need `python -m steps.ui`; index.md's hint names the command and where the address comes
    from, with no empty parenthesis when the UI's address is not configured."""
    page = index_html("n00bGPT lab", "", TABLE, [], {})
    top = " ".join("".join(Links(page).top).split())
    assert "python -m steps.ui" in top and "prints its address" in top, top
    assert f"{LOCAL_UI}/lab/report/index.html" in top
    assert "location.protocol" in page and "'file:'" in page  # as a file: links point at steps.ui's default
    md = index_markdown("n00bGPT lab", "", TABLE, [], {})
    hint = next(ln for ln in md.splitlines() if ln.startswith("Every row links"))
    assert "`python -m steps.ui`" in hint and "prints the report's address" in hint and "()" not in hint
    assert not re.search(r"open\s*\)", hint) and "open )." not in md
    configured = index_markdown("n00bGPT lab", "http://ui:5000", TABLE, [], {})
    assert "at http://ui:5000 (serve the store there with `python -m steps.ui`)" in configured
    top = " ".join("".join(Links(index_html("t", "http://ui:5000", TABLE, [], {})).top).split())
    assert "Run links open the MLflow UI at http://ui:5000: serve the store there with python -m steps.ui" in top


def test_the_run_link_follows_the_cell_which_stays_in_view():
    """#49 10: a wide table's row name (its cell) and run link are its first columns, the cell's kept in
    view while the table scrolls sideways (sticky); the headline's stage likewise."""
    page = html_table(TABLE, "http://ui")
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", page)
    assert heads[:2] == ["cell", "run"] and heads[2:] == ["status", "tokens/s", "vs baseline"]
    assert '<th class="key">cell</th>' in page and '<td class="key">baseline</td>' in page
    assert re.search(r"\.key\{position:sticky;left:0", index_html("t", "", TABLE, []))
    md_head = stage_markdown("perf", TABLE, {}, [], "").split("\n")[4]
    assert [c.strip() for c in md_head.strip("|").split("|")][:2] == ["cell", "run_id"]
    head = pd.DataFrame({"stage": ["perf"], "cells": [2], "experiment_id": ["3"], "run_id": ["0123456789abcdef"]})
    assert re.findall(r"<th[^>]*>([^<]*)</th>", html_table(head))[:2] == ["stage", "run"]


def test_a_long_cell_is_cut_with_its_whole_text_as_tooltip():
    """#49 10: a long text (a scale cell's source, a memory breakdown) keeps its row low: cut at LONG
    characters, the whole of it in the cell's title."""
    from steps.report.render import LONG

    long = "state 14.96 sim / 14.96 Playbook / 14.96 predicted GiB; " * 4
    page = html_table(TABLE.assign(source=[long, "short"]))
    cut = re.search(r'<td title="([^"]*)">([^<]*)</td>', page)
    assert cut and cut.group(1) == long and cut.group(2).endswith("…") and len(cut.group(2)) <= LONG
    assert "<td>short</td>" in page


def test_the_scale_plot_fits_the_report_with_a_readable_legend(tmp_path):
    """#49 10: the scale plot with the default DAG's many series is drawn no wider than the report shows
    it (so its legend is not scaled down below its 8 points), the legend under the panels."""
    import matplotlib.image

    from steps.scale.figures import FITS, MEMORY, TOKENS, world_curves

    rows = [
        {
            "status": "ok",
            "model": model,
            "cluster": "grand_teton" if i % 2 else "dgx_h100",
            "plan": f"fsdp{2 ** (i % 4)}×tp{i % 3 + 1} ac-selective",
            "world": 2 ** (3 + i % 3),
            "batch/rank (seqs × seq)": f"{i % 3 + 1} × 8192",
            FITS: "fits: 64.9 GiB of 95" if i % 2 else "fits: 8.6 GiB of 80",
            MEMORY: 10.0 + i,
            TOKENS: 1000.0 * (i + 1),
        }
        for i, model in enumerate(["llama-3.1-8b", "gpt2-124m", "olmoe-1b-7b", "llama-3.1-70b"] * 5)
    ]
    [png] = world_curves(pd.DataFrame(rows), tmp_path)
    height, width = matplotlib.image.imread(png).shape[:2]
    assert width <= 1150, f"{width} px: the report shows it scaled to ~1150 px, its legend shrunk"
    assert height > width / 3  # the legend's rows under the panels, not cut off


def test_the_report_and_the_lab_run_link_each_other():
    """#49 11: the report links the UI's experiment list (relative to the report as steps.ui serves
    it, or at the configured UI), and the lab run's description links the report."""
    assert 'href="../../#/experiments?workflowType=machine_learning"' in index_html("t", "", TABLE, [])
    assert 'href="http://ui/#/experiments?workflowType=machine_learning"' in index_html("t", "http://ui", TABLE, [])
    text = lab.description("`snakemake` in `/w`", "FINISHED", [], "1", "abc")
    assert "[lab/report/index.html](lab/report/index.html)" in text


def test_two_lab_runs_side_by_side_from_the_ui(tmp_path):
    """#49 11: the lab run's description links the page steps.ui serves at lab/compare, which shows
    `steps.compare --lab A --vs B` for two lab runs, or its one line when there is no run before."""
    from flask import Flask

    from steps.ui_app import add_compare

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = store.client(uri)
    exp = store.experiment_id(c, "lab", uri)
    run = c.create_run(exp, run_name="lab run")
    store.experiment_id(c, "perf", uri)
    text = lab.description("`snakemake` in `/w`", "FINISHED", [], exp, run.info.run_id)
    link = f"lab/compare?a={run.info.run_id[:8]}&b=previous"
    assert f"]({link})" in text
    app = add_compare(Flask("ui"), uri)
    page = app.test_client().get("/" + link).get_data(as_text=True)
    assert "no lab run before" in page and run.info.run_id[:8] in page


def test_two_lab_runs_are_picked_not_typed(tmp_path):
    """#49 11: lab/compare with no arguments lists the lab runs, newest first, in two selects (the newest
    against the one before it chosen) and a Compare button; the report, steps.ui and each lab run's
    description link it."""
    from flask import Flask

    from steps.ui_app import add_compare

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = store.client(uri)
    exp = store.experiment_id(c, "lab", uri)
    old, new = (c.create_run(exp, run_name=n, start_time=t).info.run_id for n, t in (("lab a", 1000), ("lab b", 2000)))
    page = add_compare(Flask("ui"), uri).test_client().get("/lab/compare").get_data(as_text=True)
    form = page[page.index("<form") : page.index("</form>")]
    picks = re.findall(r"<select name='(\w)'>(.*?)</select>", form)
    assert [name for name, _ in picks] == ["a", "b"] and "<button type='submit'>Compare</button>" in form
    assert re.findall(r"value='(\w+)'", picks[0][1]) == [new, old]
    assert re.findall(r"value='(\w+)'", picks[1][1]) == ["previous", new, old]
    assert f"value='{new}' selected" in picks[0][1] and "value='previous' selected" in picks[1][1]
    assert page.index(new[:8]) < page.index(old[:8], page.index("</form>"))  # the list, newest first
    assert "](lab/compare)" in lab.description("`snakemake` in `/w`", "FINISHED", [], exp, new)
