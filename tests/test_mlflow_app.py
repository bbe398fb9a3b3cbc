"""The lab's MLflow app: a browser opens MLflow's UI on its model-training pages, whatever it stored.
Checked against the installed MLflow's own UI build (its page and its bundle), so an MLflow whose UI
keeps the switch elsewhere fails here. tests/test_browser.py checks it in Chromium, and so does
docs/tracking.md (a fresh profile lands on an experiment's runs table)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import mlflow.server

from steps.tracking import store
from steps.tracking.describe import FRAMED_LINKS, OPEN_MESSAGE
from steps.ui_app import (
    ASSISTANT_OPENED_KEY,
    BROWSER_DEFAULTS,
    BROWSER_FORCED,
    DEFAULT_SCRIPT,
    OPEN_LINKS_SCRIPT,
    PAGE_SCRIPTS,
    WORKFLOW_KEY,
    add_default,
    page_scripts,
    with_model_training_default,
)
from tests.conftest import clean_env

BUILD = Path(mlflow.server.__file__).parent / "js/build"


def test_key_is_the_one_mlflows_ui_reads():
    """The UI's switch: `useLocalStorage({key: "mlflow.workflowType", version: 1, ...})`, stored as
    `<key>_v<version>`, holding "genai" or "machine_learning" as JSON."""
    bundle = "".join(p.read_text(errors="replace") for p in (BUILD / "static/js").glob("main.*.js"))
    found = re.search(r'key:"(mlflow\.workflowType)",version:(\d+)', bundle)
    assert found, "MLflow's UI no longer keeps the GenAI/Model-training switch where this app sets it"
    assert f"{found[1]}_v{found[2]}" == WORKFLOW_KEY
    assert 'MACHINE_LEARNING="machine_learning"' in bundle and BROWSER_FORCED[WORKFLOW_KEY] == '"machine_learning"'


def test_the_assistant_does_not_open_itself():
    """#49 8: MLflow's Assistant panel opens on a browser's first visit unless
    `useLocalStorage({key: "mlflow.assistant.fab.autoOpenedOnFirstLoad", version: 1})` holds true: the
    lab's page stores true for a browser that has no value yet."""
    bundle = "".join(p.read_text(errors="replace") for p in (BUILD / "static/js").glob("*.js"))
    found = re.search(r'key:"(mlflow\.assistant\.fab\.autoOpenedOnFirstLoad)",version:(\d+),initialValue:!1', bundle)
    assert found, "MLflow's UI no longer keeps the Assistant's first-visit flag where this app sets it"
    assert f"{found[1]}_v{found[2]}" == ASSISTANT_OPENED_KEY and BROWSER_DEFAULTS[ASSISTANT_OPENED_KEY] == "true"


def test_page_sets_the_defaults_first():
    """Model training always (#49 8: its switch is hidden, a stored "genai" would stick), the Assistant's
    flag only where the browser has none."""
    page = (BUILD / "index.html").read_bytes()
    served = with_model_training_default(page).decode()
    assert served.replace(page_scripts(), "") == page.decode() and page_scripts().startswith(PAGE_SCRIPTS)
    assert served.index(DEFAULT_SCRIPT) < served.index("static/js/main.")
    assert "for(k in d)if(localStorage.getItem(k)===null)" in DEFAULT_SCRIPT  # a user's own choice stays
    assert "for(k in f)localStorage.setItem(k,f[k])" in DEFAULT_SCRIPT
    assert f'"{ASSISTANT_OPENED_KEY}": ' in DEFAULT_SCRIPT and ASSISTANT_OPENED_KEY in BROWSER_DEFAULTS
    assert f'"{WORKFLOW_KEY}": ' in DEFAULT_SCRIPT and WORKFLOW_KEY in BROWSER_FORCED


def test_app_serves_the_page_with_the_default():
    from flask import Flask

    app = Flask("ui", static_folder=str(BUILD))
    app.add_url_rule("/", "serve", lambda: "MLflow's page")
    add_default(app)
    body = app.test_client().get("/").get_data(as_text=True)
    assert body.startswith("<!doctype html>") and DEFAULT_SCRIPT in body


def test_ui_serves_the_lab_app_when_registered_else_mlflows_own():
    """`python -m steps.ui` runs `mlflow server --app-name n00bgpt-lab` where the package declares
    the plugin (pyproject.toml, installed by `pip install -e .`), MLflow's own app otherwise."""
    from steps.ui import APP_NAME, app_registered, server_command

    assert app_registered()  # this environment installed the package
    with_app = server_command(Path("lab.db"), 5000)
    assert with_app[with_app.index("--app-name") + 1] == APP_NAME
    assert "--app-name" not in server_command(Path("lab.db"), 5000, app=False)


def test_page_opens_the_links_a_framed_artifact_asks_it_to():
    """MLflow shows an HTML artifact in `<iframe sandbox="allow-scripts">` of a blob: page, which may open
    no tab and navigate no top window (checked against the installed UI bundle here; the clicks in
    headless Chromium: scripts/mlflow_artifact_links.mjs). The artifact posts the link (FRAMED_LINKS), and
    the UI's page opens it in a new tab, for its own frames and its own server's addresses only."""
    bundle = "".join(p.read_text(errors="replace") for p in (BUILD / "static/js").glob("*.js"))
    frame = re.search(r'className:"mlflow-html-iframe".{0,120}?sandbox:"([^"]*)"', bundle)
    assert frame and "allow-popups" not in frame[1] and "allow-top-navigation" not in frame[1]
    assert "getBlobURL" in bundle  # the page is a blob: URL: a relative link resolves against nothing
    assert f"parent.postMessage({{type:'{OPEN_MESSAGE}',url:a.href}}" in FRAMED_LINKS
    assert "location.protocol!=='blob:'" in FRAMED_LINKS  # opened any other way, the links are plain links
    assert f"d.type!=={OPEN_MESSAGE!r}" in OPEN_LINKS_SCRIPT and "u.origin!==location.origin" in OPEN_LINKS_SCRIPT
    assert "f.contentWindow===e.source" in OPEN_LINKS_SCRIPT and "open(u.href,'_blank')" in OPEN_LINKS_SCRIPT
    assert OPEN_LINKS_SCRIPT in with_model_training_default((BUILD / "index.html").read_bytes()).decode()


def test_ui_prints_its_address_once_it_answers_and_keeps_the_access_log_out(tmp_path):
    """`python -m steps.ui`: its address is its first line on stdout, printed when the server answers
    (not ~20 s before), and the server's access log and INFO lines stay out of the terminal (a browse
    is a thousand requests) unless --verbose."""
    from steps.ui import server_command

    db = tmp_path / "results" / "mlflow.db"
    store.client(f"sqlite:///{db}")  # an empty store
    cmd = [sys.executable, "-m", "steps.ui", "--db", str(db), "--port", "0"]
    proc = subprocess.Popen(
        cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert select.select([proc.stdout], [], [], 240)[0], "steps.ui printed nothing in 240 s"
        line = proc.stdout.readline()
        base = re.match(r"MLflow UI on (http://127\.0\.0\.1:\d+)/#/experiments", line)
        assert base, line
        with urllib.request.urlopen(f"{base[1]}/health", timeout=5) as r:  # at once: no retry
            assert r.status == 200
        for _ in range(5):
            urllib.request.urlopen(f"{base[1]}/", timeout=30).read()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, MLflow's server and its workers
        proc.wait(timeout=30)
    err = proc.stderr.read()
    assert err.startswith("steps.ui: starting MLflow's server"), err[-3000:]
    assert "HTTP/1.1" not in err and " INFO" not in err and "DeprecationWarning" not in err, err[-3000:]
    assert "--no-access-log" in server_command(db, 5000)
    assert "--no-access-log" not in server_command(db, 5000, verbose=True)


def test_the_empty_traces_pages_are_not_linked():
    """#49 8: the lab logs no traces; the side bar's "Traces" link (`#/experiments/<id>/traces`) and a run's
    "Traces" tab (its radix id `...-trigger-evaluations`) are hidden by the lab's page. Checked against the
    bundle: an MLflow that names them otherwise fails here."""
    from steps.ui_app import HIDDEN_STYLE

    bundle = "".join(p.read_text(errors="replace") for p in (BUILD / "static/js").glob("*.js"))
    assert "/traces" in bundle and '"evaluations"' in bundle
    assert (
        HIDDEN_STYLE in PAGE_SCRIPTS and 'a[href$="/traces"]' in HIDDEN_STYLE and "-trigger-evaluations" in HIDDEN_STYLE
    )
    # the side bar's GenAI switch: two role=button divs (tests/test_browser.py checks it is not shown)
    switch = re.search(
        r'componentId:"mlflow\.sidebar\.workflow_switch".{0,3000}?defaultMessage:"Model training"', bundle
    )
    assert switch and switch[0].count('role:"button"') == 2, "MLflow's GenAI switch is no longer two role=button divs"
    assert "aside div:has(>div[role=button]+div[role=button])" in HIDDEN_STYLE


def test_each_experiment_opens_on_its_view_however_reached():
    """The UI keeps an experiment's runs-page state under `ExperimentPage-["<id>"]` in localStorage and,
    holding none, shows MLflow's default columns (checked against the installed bundle); the page is
    served with each lab experiment's saved view there, unless the browser holds the user's own."""
    from types import SimpleNamespace

    from steps.tracking import views
    from steps.ui_app import MLFLOW_DEFAULT_COLUMNS, SEEDED, STATE_KEY, seeded_states

    bundle = "".join(p.read_text(errors="replace") for p in (BUILD / "static/js").glob("*.js"))
    assert 'getStoreForComponent("ExperimentPage",' in bundle and '["MLflowLocalStorage",r.version' in bundle
    assert 'r.version="1.1"' in bundle and 'reactComponentStateKey="ReactComponentState"' in bundle
    assert STATE_KEY.format(ids='["3"]') == 'MLflowLocalStorage-1.1-ExperimentPage-["3"]-ReactComponentState'
    assert "qo.SOURCE),(0,o.GF)(r.RO.ATTRIBUTES,r.qo.MODELS),(0,o.GF)(r.RO.ATTRIBUTES,r.qo.DATASET)" in bundle
    assert len(MLFLOW_DEFAULT_COLUMNS) == 3
    view = views.stage_view("perf")
    exp = SimpleNamespace(experiment_id="14", tags={views.TAG_PREFIX + "n00bgpt": views.envelope("perf", view)})
    other = SimpleNamespace(experiment_id="0", tags={})
    states = seeded_states([exp, other])
    assert list(states) == ["14"] and states["14"][SEEDED]
    assert states["14"]["columnOrder"][3:6] == ["tags.`cell`", "tags.`status`", "metrics.`speedup`"]
    page = with_model_training_default((BUILD / "index.html").read_bytes(), states).decode()
    assert page.index('"14": {"selectedColumns"') < page.index("static/js/main.")
    assert "if(!o||o.n00bgptView||" in page  # a state of the user's own stays


def test_metric_values_are_rounded_through_the_uis_own_hook():
    """3.17's runs table reads `registry[metricKey].valueFormatter` (module METRIC_REGISTRY, `{}`)."""
    from steps.ui_app import METRIC_REGISTRY, ROUND_SCRIPT

    main = "".join(p.read_text(errors="replace") for p in (BUILD / "static/js").glob("main.*.js"))
    assert f'{METRIC_REGISTRY}(e,t,n){{"use strict";n.d(t,{{g:()=>r}});const r={{}}}}' in main
    bundle = "".join(p.read_text(errors="replace") for p in (BUILD / "static/js").glob("*.js"))
    assert "t=Ue.g[e]" in bundle and "valueFormatter:null===t||void 0===t?void 0:t.valueFormatter" in bundle
    assert "r=globalThis.webpackChunk_mlflow_mlflow=globalThis.webpackChunk_mlflow_mlflow||[];r.forEach(" in main
    assert "maximumSignificantDigits:4" in ROUND_SCRIPT
    assert ROUND_SCRIPT in with_model_training_default((BUILD / "index.html").read_bytes()).decode()
