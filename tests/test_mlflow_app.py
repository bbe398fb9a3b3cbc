"""The lab's MLflow app: a browser with no choice stored opens MLflow's UI on its model-training
pages. Checked against the installed MLflow's own UI build (its page and its bundle), so an MLflow
whose UI keeps the switch elsewhere fails here. A headless-Chromium check of the same is in
docs/tracking.md (a fresh profile lands on an experiment's runs table)."""

from __future__ import annotations

import re
from pathlib import Path

import mlflow.server

from steps.tracking.mlflow_app import DEFAULT_SCRIPT, WORKFLOW_KEY, add_default, with_model_training_default

BUILD = Path(mlflow.server.__file__).parent / "js/build"


def test_key_is_the_one_mlflows_ui_reads():
    """The UI's switch: `useLocalStorage({key: "mlflow.workflowType", version: 1, ...})`, stored as
    `<key>_v<version>`, holding "genai" or "machine_learning" as JSON."""
    bundle = "".join(p.read_text(errors="replace") for p in (BUILD / "static/js").glob("main.*.js"))
    found = re.search(r'key:"(mlflow\.workflowType)",version:(\d+)', bundle)
    assert found, "MLflow's UI no longer keeps the GenAI/Model-training switch where this app sets it"
    assert f"{found[1]}_v{found[2]}" == WORKFLOW_KEY
    assert 'MACHINE_LEARNING="machine_learning"' in bundle and """'"machine_learning"'""" in DEFAULT_SCRIPT


def test_page_sets_the_default_first_and_only_when_unset():
    page = (BUILD / "index.html").read_bytes()
    served = with_model_training_default(page).decode()
    assert served.replace(DEFAULT_SCRIPT, "") == page.decode()
    assert served.index(DEFAULT_SCRIPT) < served.index("static/js/main.")
    assert f"if(!localStorage.getItem('{WORKFLOW_KEY}'))" in DEFAULT_SCRIPT  # a user's own choice stays


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
