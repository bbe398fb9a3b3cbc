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
    """First in the file: the server may start here, in this test's environment, so the next test
    forks only if another test's name (PYTEST_CURRENT_TEST) does not stop it."""
    seen = shown(tmp_path, {"HF_HUB_OFFLINE": "1"})  # huggingface_hub reads it once, when imported
    assert not seen["forked"] and seen["env"]["HF_HUB_OFFLINE"] == "1"


def test_a_run_time_variable_forks_and_reaches_the_child(tmp_path):
    seen = shown(tmp_path, {"N00BGPT_LAB_RUN": "lab-1"})
    stops = forked_stage.blocking(clean_env())
    assert not stops, f"the server's environment and this test's differ in {stops}"
    assert seen["forked"] and seen["argv"] == ["--a", "1"] and seen["cwd"] == str(tmp_path)
    assert seen["env"]["N00BGPT_LAB_RUN"] == "lab-1"
    assert seen["env"]["PYTEST_CURRENT_TEST"] == clean_env()["PYTEST_CURRENT_TEST"]  # this test's, not the first's
    assert shown(tmp_path)["env"]["N00BGPT_LAB_RUN"] is None  # nothing left behind by the last child
