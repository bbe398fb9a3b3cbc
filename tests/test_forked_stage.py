"""conftest.run_module forks a stage from tests/forked_stage.py's server only where that cannot change
what the stage sees: the child gets the call's whole environment, and a variable that a preloaded
library reads when it is imported sends the call to a plain `python -m`."""

from __future__ import annotations

import json

from tests import forked_stage
from tests.conftest import clean_env, run_module

SHOW = """import json, multiprocessing, os, sys
keys = ("N00BGPT_LAB_RUN", "HF_HUB_OFFLINE", "PYTEST_CURRENT_TEST")
print(json.dumps({"forked": multiprocessing.parent_process() is not None, "argv": sys.argv[1:],
                  "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}}))
"""


def shown(tmp_path, env_extra: dict | None = None) -> dict:
    (tmp_path / "show_env.py").write_text(SHOW)
    proc = run_module(tmp_path, "show_env", ["--a", "1"], timeout=120, env_extra=env_extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_an_import_time_variable_runs_plain_python(tmp_path):
    seen = shown(tmp_path, {"HF_HUB_OFFLINE": "1"})  # huggingface_hub reads it once, when imported
    assert not seen["forked"] and seen["env"]["HF_HUB_OFFLINE"] == "1"


def test_a_run_time_variable_forks_and_reaches_the_child(tmp_path, monkeypatch):
    """The server started in the environment of the session's first test (its PYTEST_CURRENT_TEST),
    so this call forks only if another test's name does not stop it. What earlier tests' module or
    session fixtures left changed in this process (forked_stage.blocking names it; it only makes
    later stages run plainly, and slower) is set back to the server's first."""
    shown(tmp_path)  # the server is running
    server = forked_stage.server_env()
    for key in set(forked_stage.blocking(clean_env())) - {"PYTEST_CURRENT_TEST"}:  # that one is under test
        if key in server:
            monkeypatch.setenv(key, server[key])
        else:
            monkeypatch.delenv(key, raising=False)
    seen = shown(tmp_path, {"N00BGPT_LAB_RUN": "lab-1"})
    assert seen["forked"] and seen["argv"] == ["--a", "1"] and seen["cwd"] == str(tmp_path)
    assert seen["env"]["N00BGPT_LAB_RUN"] == "lab-1"
    assert seen["env"]["PYTEST_CURRENT_TEST"] == clean_env()["PYTEST_CURRENT_TEST"]  # this test's, not the first's
    assert shown(tmp_path)["env"]["N00BGPT_LAB_RUN"] is None  # nothing left behind by the last child
