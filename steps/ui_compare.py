"""Two lab runs side by side in the browser, served by the lab's MLflow app (steps/ui_app.py) at
`<base>/lab/compare` (describe.COMPARE_PATH).

With no arguments the page lists the store's lab runs, newest first, with two selects (the newest and
the one before it chosen) and a Compare button: a user reaches it from steps.ui's printed addresses,
the report and each lab run's description, without typing run ids. `?a=<lab run>&b=<lab run|previous>`
shows `python -m steps.compare --lab A --vs B` (what changed between them), or the one line that says
why it cannot.
"""

from __future__ import annotations

import html

from flask import Flask, Response, request

from steps.tracking.describe import COMPARE_PATH, ui_url

UI = "../"  # the UI's address relative to the page's (<base>/lab/compare)
HEAD = "<!doctype html><meta charset='utf-8'><title>{title}</title><style>{css}</style>"
CSS = "body{font-family:sans-serif;margin:1em 2em}td,th{padding:2px 10px;text-align:left}select{max-width:40em}"
UI_LINK = f"<a href='{UI}#/experiments?workflowType=machine_learning'>MLflow UI</a>"


def compare_page(uri: str, a: str | None, b: str | None) -> str:
    """`python -m steps.compare --lab A --vs B` as a page: what changed between two lab runs (B default
    the one before A), or the one line that says why not."""
    from steps.compare import CompareError, compare

    try:
        text = compare(uri=uri, lab=a or None, vs=b or "previous", fmt="table", width=200, ui=UI)
    except CompareError as exc:
        text = str(exc)
    title = f"lab run {a or 'latest'} vs {b or 'previous'}"
    return (
        HEAD.format(title=html.escape(title), css=CSS)
        + "<p>Two lab runs side by side (<code>python -m steps.compare --lab A --vs B</code>): "
        f"<a href='compare'>pick two others</a> · {UI_LINK}</p><pre>{html.escape(text)}</pre>"
    )


def picker_page(uri: str) -> str:
    """The store's lab runs, newest first, and a form that compares two of them (the newest and the one
    before it chosen), or the one line that says why there is none."""
    from steps.compare import vs
    from steps.compare.read import CompareError, read

    try:
        st = read(uri)
        labs = vs.lab_runs(st.of(vs.LAB))[::-1]
    except CompareError as exc:
        labs, why = [], str(exc)
    else:
        why = "" if labs else "the store has no lab run (experiment n00bgpt/lab): run the DAG with `snakemake` first"
    head = HEAD.format(title="compare two lab runs", css=CSS) + f"<h1>Compare two lab runs</h1><p>{UI_LINK}</p>"
    if why:
        return head + f"<p>{html.escape(why)}</p>"

    def option(r: dict, chosen: bool) -> str:
        name = f"{r['run_id'][:8]}: {vs.describe(r)}"
        return f"<option value='{r['run_id']}'{' selected' if chosen else ''}>{html.escape(name)}</option>"

    runs_a = "".join(option(r, i == 0) for i, r in enumerate(labs))
    runs_b = "<option value='previous' selected>the lab run before it</option>" + "".join(
        option(r, False) for r in labs
    )
    rows = "".join(
        f"<tr><td><a href='{ui_url(UI, r['experiment_id'], r['run_id'])}' target='_blank' rel='noopener'>"
        f"{r['run_id'][:8]}</a></td><td>{html.escape(vs.describe(r))}</td>"
        f"<td>{html.escape(str(r['tags'].get('mlflow.runName', '')))}</td></tr>"
        for r in labs
    )
    one = "<p>The store has one lab run: run the DAG again after a change to have two to compare.</p>"
    return (
        head
        + (one if len(labs) == 1 else "")
        + "<form method='get' action='compare'>"
        + f"<label>Lab run <select name='a'>{runs_a}</select></label> "
        + f"<label>against <select name='b'>{runs_b}</select></label> <button type='submit'>Compare</button></form>"
        + "<h2>Lab runs, newest first</h2><table><tr><th>run</th><th>started, status</th><th>name</th></tr>"
        + f"{rows}</table>"
    )


def add_compare(app: Flask, uri: str | None) -> Flask:
    """Serve the picker and compare_page at `<base>/lab/compare` (COMPARE_PATH)."""
    if not uri:
        return app

    def page() -> Response:
        a, b = request.args.get("a"), request.args.get("b")
        body = compare_page(uri, a, b) if a or b else picker_page(uri)
        return Response(body, mimetype="text/html")

    app.add_url_rule(f"/{COMPARE_PATH}", "lab_compare", page)
    return app
