"""What the MLflow UI shows about the lab in words: each experiment's description (what the stage
does, which report table it feeds), each run's note (what the cell is), its source tags, and the
UI address that opens on a stage's runs.

MLflow conventions used (mlflow.utils.mlflow_tags):
  experiment  mlflow.note.content (description), mlflow.experimentKind = custom_model_development
              (what the UI's own "Machine learning" choice writes)
  run         mlflow.note.content, mlflow.source.name/type, mlflow.source.git.commit, mlflow.runName,
              mlflow.parentRunId

MLflow 3.17's UI decides between its GenAI pages (traces overview) and its model-training pages
(runs table) with one switch per browser ("GenAI | Model training", default GenAI) that the URL
parameter `workflowType=machine_learning` overrides; `ui_url` adds it to every address the lab prints,
and the server `python -m steps.ui` starts (steps/ui_app.py) sets that switch for a
browser that has none stored.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

EXPERIMENT_KIND = "custom_model_development"
NOTE = "mlflow.note.content"
KIND = "mlflow.experimentKind"
UI_QUERY = "workflowType=machine_learning"
VIEW_KEY = "n00bgpt"  # every experiment's saved runs view: tag mlflow.sharedViewState.<VIEW_KEY> (views.py)
VIEW_QUERY = f"viewStateShareKey={VIEW_KEY}"
LAB_DESCRIPTION = (
    "One run per `snakemake` invocation of the n00bGPT lab (its name: `lab run <start time>`). Every job "
    "of that invocation logs its own run in its stage's experiment (`n00bgpt/<stage>`), nested under this "
    "one (`mlflow.parentRunId`); the run's description lists them with their status when the DAG ends, "
    "and `results/reports/index.md` tabulates them."
)


def module_summary(module: str) -> str:
    """First paragraph of a module's docstring, read from its source (the module is not imported:
    that would load torch into every caller)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def md_escape(text: str) -> str:
    """Text as Markdown shows it literally: `*`, `\\` and a `_` that could open or close emphasis
    outside code spans escaped (a docstring's `__main__.py` is not bold `main.py`; `gpt_train` stays
    as it is); code spans stay as written."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        parts[i] = re.sub(r"\\|\*|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", lambda m: "\\" + m.group(0), parts[i])
    return "`".join(parts)


def stage_description(module: str, columns: dict | None = None, headline: tuple | None = None) -> str:
    """Markdown for a stage's experiment: the module's summary and the report table it feeds."""
    stage = module.rpartition(".")[2]
    lines = [md_escape(module_summary(module)) or f"Stage `{stage}`.", ""]
    if stage == "report":
        lines.append("Writes `results/reports/index.md` / `index.html` from every other stage's runs.")
    else:
        lines.append(
            f"Feeds the report's `{stage}` table (`results/reports/{stage}.md`, section `## {stage}` of "
            "`results/reports/index.md`): one row per cell, one run per cell here."
        )
        if columns:
            lines.append("Columns: " + ", ".join(f"{t} (`{ref}`)" for t, ref in columns.items()) + ".")
        if headline:
            lines.append(f"Headline: {headline[0]} ({headline[2]} of `{headline[1]}`).")
    lines += ["", f"Runs: `python -m {module} --cfg JSON --output metrics=PATH`, one per Snakemake job."]
    return "\n".join(lines)


def cell_note(stage: str, cell: str, overrides: dict | None, params: dict) -> str:
    """Markdown note of a job's run: which cell it is and how it differs from its stage's section."""
    desc = params.get("desc") if isinstance(params.get("desc"), str) else ""
    head = f"Cell `{cell}` of stage `{stage}`" + (f": {md_escape(desc)}" if desc else ".")
    if overrides is None:
        return head + "\n\nRun by hand (not from the Snakefile): the parameters tab has the resolved config."
    shown = {k: v for k, v in overrides.items() if k != "desc"}
    if not shown:
        return head + "\n\nThe stage's section as configured, with no cell override."
    rows = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in shown.items())
    return f"{head}\n\nOverrides of the stage's section:\n\n| key | value |\n|---|---|\n{rows}"


def ui_url(base: str, experiment_id: str | None = None, run_id: str | None = None, artifact: str = "") -> str:
    """The UI page of the experiment list, an experiment's runs (opened on its saved view, steps/tracking/
    views.py), one run, or one of a run's artifacts, in model-training mode."""
    path, query = "/#/experiments", UI_QUERY
    if experiment_id:
        path += f"/{experiment_id}" + (f"/runs/{run_id}" if run_id else "/runs")
        path += f"/artifacts/{artifact}" if run_id and artifact else ""
        query += "" if run_id else f"&{VIEW_QUERY}"
    return f"{base.rstrip('/')}{path}?{query}"


UI_PORT = 5000  # `python -m steps.ui`'s default port: the UI's address there is LOCAL_UI
LOCAL_UI = f"http://127.0.0.1:{UI_PORT}"

# Where `python -m steps.ui` serves results/reports/ (the report's HTML and plots), under the UI's base:
# the report's run links are relative to it, so they open on whatever host, port or prefix serves both.
REPORT_PATH = "lab/report/"
# Where `python -m steps.ui` serves two lab runs side by side (steps/ui_compare.py): with no arguments, a
# page to pick them; `?a=<lab run>&b=<lab run|previous>` (ids or their first characters) compares them.
COMPARE_PATH = "lab/compare"


def report_run_link(experiment_id: str, run_id: str | None = None, base: str = "") -> str:
    """A run's UI page (or, without `run_id`, its experiment's, on its saved view) as the report links
    it: under `base` when one is configured (an absolute UI address), else relative to the report's own
    address as steps.ui serves it (`<base>/lab/report/`): `../../#/experiments/<id>/runs/<run>`, which
    resolves to the UI that served the report."""
    return ui_url(base or "../" * REPORT_PATH.count("/"), experiment_id, run_id)


# A link in an HTML page the lab writes (the lab run's jobs.html, the report's index.html) opens a new tab:
# opened by hand or served by steps.ui, a new tab keeps the table; MLflow's artifact view shows such a page
# in a sandboxed frame (`<iframe sandbox="allow-scripts">` of a `blob:` page) that may open no tab, navigate
# no top window, and resolves no relative link: FRAMED_LINKS handles that case.
NEW_TAB = 'target="_blank" rel="noopener"'
OPEN_MESSAGE = "n00bgpt.open"  # what a framed page posts to MLflow's page (steps/ui_app.py)
FRAMED_LINKS = (
    "<script>(function(){if(location.protocol!=='blob:')return;"
    # the UI's address: MLflow's page that framed this one (its URL without the #/ route)
    "var r=new URL(document.referrer||new URL(location.href).origin+'/'),ui=r.origin+r.pathname,t,"
    "note=document.getElementById('n00bgpt-framed');"
    # every link to a UI page (`#/experiments/...`, relative to the UI or the report) made absolute, so
    # Ctrl-click, middle-click and "Open link in new tab" work on any MLflow server; and the report's other
    # links up to the UI's address (`../../lab/compare`: steps.ui's pages beside the UI)
    "document.querySelectorAll('a[href]').forEach(function(a){var h=a.getAttribute('href'),i=h.indexOf('#/');"
    "if(i>0&&!/^[a-z][a-z0-9+.-]*:/i.test(h))a.setAttribute('href',ui+h.slice(i));"
    "else if(h.indexOf('%(up)s')===0)a.setAttribute('href',ui+h.slice(%(n)d))});"
    "addEventListener('message',function(e){if(e.data&&e.data.type==='%(msg)s.opened')clearTimeout(t)});"
    "document.addEventListener('click',function(e){var a=e.target.closest&&e.target.closest('a[href]');if(!a)return;"
    "var h=a.getAttribute('href');"
    # an in-page link (the contents): scrolled to here, as the frame cannot navigate to its own blob
    "if(h.charAt(0)==='#'){e.preventDefault();var to=document.getElementById(decodeURIComponent(h.slice(1)));"
    "if(to)to.scrollIntoView();return}"
    "if(e.button||e.ctrlKey||e.metaKey||e.shiftKey||e.altKey)return;"  # the browser's own new tab
    # a plain click: MLflow's page opens it when the lab's app serves it (steps.ui), else say how
    "e.preventDefault();parent.postMessage({type:'%(msg)s',url:a.href},'*');clearTimeout(t);"
    "t=setTimeout(function(){if(note)note.style.display='block'},600)})})();</script>"
) % {"msg": OPEN_MESSAGE, "up": "../" * REPORT_PATH.count("/"), "n": 3 * REPORT_PATH.count("/")}
FRAMED_NOTE = (
    "<p id='n00bgpt-framed' style='display:none;position:sticky;top:0;background:#ffd;padding:4px 8px'>"
    "MLflow shows this page in a sandboxed frame, which cannot open a link on a plain click: Ctrl-click "
    "(&#8984;-click on a Mac) or middle-click it to open it in a new tab, or browse with "
    "<code>python -m steps.ui</code>, where a click opens it.</p>"
)


def report_url(base: str) -> str:
    """The report's address under the UI's `base` (what steps.ui prints beside the UI's own)."""
    return f"{base.rstrip('/')}/{REPORT_PATH}index.html"
