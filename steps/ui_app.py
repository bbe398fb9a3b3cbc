"""The lab's MLflow server app: MLflow's own, whose UI a new browser opens on its runs.

MLflow 3's UI keeps one "GenAI | Model training" switch per browser, in `localStorage` under
`mlflow.workflowType_v1`, and starts a new browser in GenAI mode: an experiment then opens on an
empty traces overview, not on its runs (3.17's UI no longer reads the experiment's
`mlflow.experimentKind` tag). This app is MLflow's server app, registered as the `mlflow.app` plugin
`n00bgpt-lab` (pyproject.toml) and started by `python -m steps.ui` as
`mlflow server --app-name n00bgpt-lab`; the one change: the UI's page sets the switch to
"Model training" and hides it (the lab logs no traces: GenAI mode shows only empty pages, and a choice of
it would stick to the browser), and keeps MLflow's Assistant panel (an LLM chat the lab has no provider
for) from opening itself on the first visit (a choice the user makes there stays theirs).
And a link clicked in one of the lab's HTML artifacts (jobs.html, the report), which MLflow shows in a
sandboxed frame that may open no tab, opens in a new tab: the page asks this one to open it
(describe.FRAMED_LINKS), and this one opens it when it is a page of this same server.

Each lab experiment opens on its saved view (steps/tracking/views.py: its key columns, in order, sorted
the stage's way) however it is reached: the UI keeps an experiment's runs-page state per browser in
`localStorage` (`MLflowLocalStorage-1.1-ExperimentPage-["<id>"]-ReactComponentState`, the state a
saved view holds) and shows MLflow's default columns (Source, Models, Dataset) where it holds none;
the page is served with the store's views seeded there (SEED_SCRIPT) unless the browser holds a state
of the user's own. And the runs table shows metric values to 4 significant digits, as the report does
(steps/tables.fmt), through the UI's own per-metric display hook (its `valueFormatter` registry, module
METRIC_REGISTRY of 3.17's bundle); the logged values are untouched (a cell's tooltip shows them whole).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flask import Flask, Response, send_from_directory

from steps.tracking.describe import OPEN_MESSAGE, REPORT_PATH
from steps.ui_compare import add_compare

REPORTS_ENV = "N00BGPT_REPORTS"  # the folder of the lab's report (python -m steps.ui sets it)
STORE_ENV = "N00BGPT_STORE"  # the store's tracking URI, for the compare page (python -m steps.ui sets it)
WORKFLOW_KEY = "mlflow.workflowType_v1"  # the UI's useLocalStorage key ("<key>_v<version>")
# MLflow 3.17's Assistant (a chat panel for an LLM provider the lab has none of) opens itself on a browser's
# first visit to a local server unless this key says it already has
ASSISTANT_OPENED_KEY = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
# the UI's choices a new browser starts with (JSON values, as the UI stores them); a choice the user makes stays
BROWSER_DEFAULTS = {ASSISTANT_OPENED_KEY: "true"}
# and the one it always has: "Model training", as the GenAI switch is hidden (HIDDEN_STYLE), so a browser that
# stored "genai" (a visit to a plain `mlflow ui` on the same address) is not stuck on empty traces pages
BROWSER_FORCED = {WORKFLOW_KEY: '"machine_learning"'}
DEFAULT_SCRIPT = (
    "<script>try{var d=%s,f=%s,k;for(k in d)if(localStorage.getItem(k)===null)localStorage.setItem(k,d[k]);"
    "for(k in f)localStorage.setItem(k,f[k])}catch(e){}</script>"
    % (json.dumps(BROWSER_DEFAULTS), json.dumps(BROWSER_FORCED))
)
# A run link clicked in an HTML artifact's sandboxed frame (describe.FRAMED_LINKS posts its address): opened
# in a new tab by this page (the click's activation reaches it) when it is an address of this server and the
# message comes from one of this page's frames; the frame hears back, else it shows how to open it.
OPEN_LINKS_SCRIPT = (
    "<script>addEventListener('message',function(e){var d=e.data,u;"
    "if(!d||d.type!==%(msg)r||typeof d.url!=='string')return;"
    "if(![].some.call(document.querySelectorAll('iframe'),function(f){return f.contentWindow===e.source}))return;"
    "try{u=new URL(d.url,location.href)}catch(_){return}"
    "if(u.origin!==location.origin||!/^https?:$/.test(u.protocol))return;"
    "var w=open(u.href,'_blank');if(w)w.opener=null;else location.href=u.href;"
    "e.source.postMessage({type:%(done)r},'*')})</script>" % {"msg": OPEN_MESSAGE, "done": OPEN_MESSAGE + ".opened"}
)
# The lab logs no traces (GenAI request traces): the links to MLflow's traces pages (an experiment's
# "Traces" in the side bar, a run's "Traces" tab), each an empty page, are hidden, and so is the side bar's
# "GenAI | Model training" switch (two `role=button` divs side by side, its only such pair; its GenAI side
# shows every experiment as its empty traces pages).
HIDDEN_STYLE = (
    '<style>a[href$="/traces"],a[href*="/traces?"],'
    '[role=tab][id$="-trigger-evaluations"],'
    "aside div:has(>div[role=button]+div[role=button]){display:none!important}</style>"
)
PAGE_SCRIPTS = DEFAULT_SCRIPT + OPEN_LINKS_SCRIPT + HIDDEN_STYLE
STATE_KEY = "MLflowLocalStorage-1.1-ExperimentPage-{ids}-ReactComponentState"  # {ids}: JSON of [experiment id]
SEEDED = "n00bgptView"  # in a state this page seeded: the view it came from (the user changed nothing yet)
# MLflow's default columns: a state holding only these is no choice of the user's (a visit before the view)
MLFLOW_DEFAULT_COLUMNS = ["attributes.`Source`", "attributes.`Models`", "attributes.`Dataset`"]
SEED_SCRIPT = (
    "<script>(function(v){try{Object.keys(v).forEach(function(id){var k=%(key)r.replace('{ids}',JSON.stringify([id])),"
    "o=null;try{o=JSON.parse(localStorage.getItem(k))}catch(_){}"
    "if(!o||o.%(seeded)s||JSON.stringify(o.selectedColumns||[])===%(default)r)"
    "localStorage.setItem(k,JSON.stringify(v[id]))})}catch(e){}})(%%s)</script>"
) % {"key": STATE_KEY, "seeded": SEEDED, "default": json.dumps(MLFLOW_DEFAULT_COLUMNS, separators=(",", ":"))}
METRIC_REGISTRY = 13071  # 3.17's bundle: `{}` keyed by metric key -> {displayName, valueFormatter, ...}
# Every metric key's entry (a prototype behind the registry's own): its value to 4 significant digits.
ROUND_SCRIPT = (
    "<script>(globalThis.webpackChunk_mlflow_mlflow=globalThis.webpackChunk_mlflow_mlflow||[]).push([['n00bgpt-round'],{},"
    "function(r){try{var g=r(%d).g;if(!g||typeof g!=='object'||Object.getPrototypeOf(g)!==Object.prototype)return;"
    "var f={valueFormatter:function(p){var v=p&&p.value;"
    "if(typeof v!=='number'||!isFinite(v))return v==null?'':String(v);"
    "if(Number.isInteger(v)&&Math.abs(v)<1e15)return v.toLocaleString('en-US');"
    "if(v!==0&&(Math.abs(v)<1e-3||Math.abs(v)>=1e6))return v.toExponential(3);"
    "return v.toLocaleString('en-US',{maximumSignificantDigits:4})}};"
    "Object.setPrototypeOf(g,new Proxy({},{get:function(t,k){return typeof k==='string'&&!(k in Object.prototype)?f:"
    "Object.prototype[k]}}))}catch(e){}}])</script>" % METRIC_REGISTRY
)


def seeded_states(experiments) -> dict[str, dict]:
    """{experiment id: the runs-page state the UI keeps for it} of each experiment holding the lab's
    saved view (views.py), marked as seeded by this page."""
    from steps.tracking import views

    states = {}
    for exp in experiments:
        view = views.current(exp)
        if view is not None and view.get("selectedColumns"):  # a view written before columnOrder: ordered here
            full = views.state(view["selectedColumns"], view.get("orderByKey", ""), view.get("orderByAsc", True))
            states[exp.experiment_id] = {**full, **view, SEEDED: True}
    return states


def lab_states() -> dict[str, dict]:
    """The seeded states of the store this server serves (none where it cannot be read)."""
    try:
        from mlflow.server.handlers import _get_tracking_store

        return seeded_states(_get_tracking_store().search_experiments(max_results=1000))
    except Exception:  # the page opens anyway, on MLflow's defaults
        return {}


def with_model_training_default(page: bytes, states: dict[str, dict] | None = None) -> bytes:
    """The UI's index.html with the default set before its bundle runs (first thing in <head>), the
    listener that opens the lab's HTML artifacts' links (OPEN_LINKS_SCRIPT), the experiments' views
    seeded (SEED_SCRIPT) and metric values rounded (ROUND_SCRIPT)."""
    head = page.find(b"<head>")
    if head < 0:
        return page
    at = head + len(b"<head>")
    return page[:at] + page_scripts(states).encode() + page[at:]


def page_scripts(states: dict[str, dict] | None = None) -> str:
    """What the page gets first thing in its <head>."""
    seed = SEED_SCRIPT % json.dumps(states or {}).replace("</", "<\\/")
    return PAGE_SCRIPTS + seed + ROUND_SCRIPT


def add_default(app: Flask) -> Flask:
    """Serve the UI's page (MLflow's `serve` view, the route "/") with the default set in it."""
    folder = Path(app.static_folder)

    def serve() -> Response:
        page = folder / "index.html"
        if not page.exists():
            return original()  # MLflow's own message for a source install without the UI build
        return Response(with_model_training_default(page.read_bytes(), lab_states()), mimetype="text/html")

    original = app.view_functions["serve"]
    app.view_functions["serve"] = serve
    return app


def add_report(app: Flask, folder: str | None) -> Flask:
    """Serve the lab's report (`results/reports/`: index.html, its plots) at `<base>/lab/report/`
    (describe.REPORT_PATH), so its run links, relative to that address, open this server's run pages."""
    if not folder:
        return app

    def report(name: str = "index.html") -> Response:
        return send_from_directory(folder, name)

    app.add_url_rule(f"/{REPORT_PATH}", "lab_report_index", report)
    app.add_url_rule(f"/{REPORT_PATH}<path:name>", "lab_report", report)
    return app


def create_app():
    """MLflow's server app plus the default above: FastAPI around Flask under uvicorn (MLflow's
    default server), the Flask app itself under gunicorn/waitress."""
    from mlflow.server import app

    add_default(app)
    add_report(app, os.environ.get(REPORTS_ENV))
    add_compare(app, os.environ.get(STORE_ENV))
    if os.environ.get("_MLFLOW_SGI_NAME", "uvicorn") == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
