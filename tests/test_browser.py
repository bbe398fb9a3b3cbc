"""The lab's pages in a real browser (Playwright driving Debian's Chromium) on the smoke store, clicked
as a first-time user would: the experiment list (MLflow's GenAI switch hidden) into word2vec and perf
(each opens on its key columns, values rounded, seeds under their cell), a run's page and back by the
breadcrumb; the report served by `python -m steps.ui` and a run link in its headline and in two stage
tables; its link to the page that compares two lab runs, picked there; the lab run's jobs.html artifact
in MLflow's sandboxed frame and a run in it; and the report opened as a file, whose note says to open
it through `python -m steps.ui` and whose run links open that UI at its default address (this test's
UI answers there). Each run link must land on its run's page. Any console error of the lab's pages
(file:// ones too) fails it; the screenshots are kept in tests/artifacts/browser/ (CI keeps them)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from steps.tracking.describe import LOCAL_UI, ui_url
from tests.conftest import ROOT, clean_env

pytestmark = [pytest.mark.live, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")  # Debian's (.ci/run installs it)
SHOTS = ROOT / "tests" / "artifacts" / "browser"
# MLflow's own request the UI makes and a plain server answers 404 (no auth app): not the lab's
MLFLOW_404 = ("/ajax-api/2.0/mlflow/users/current",)
KEY_COLUMNS = {"word2vec": "metrics.`analogy_acc`", "perf": "metrics.`speedup`"}
LOADED = 120_000  # ms: a page of MLflow's UI on a loaded 2-core host


def api(base: str, path: str, body: dict) -> dict:
    """MLflow's REST API: its `get` calls take GET with the query string, the others POST JSON."""
    url = f"{base}/api/2.0/mlflow/{path}"
    if path.endswith(("/get", "/get-by-name")):
        req = urllib.request.Request(f"{url}?{urllib.parse.urlencode(body)}")
    else:
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=30) as r:
        return json.loads(r.read())


class Browse:
    """One browser context on the lab's server, recording what went wrong on the lab's own pages."""

    def __init__(self, browser, base: str):
        self.base, self.errors, self.failed = base, [], []
        self.ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        self.ctx.on("page", self.watch)
        self.page = self.ctx.new_page()

    def watch(self, page) -> None:
        if getattr(page, "_lab_watched", False):
            return
        page._lab_watched = True

        def console(msg):
            if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
                self.errors.append(f"{page.url}: {msg.text[:300]}")

        page.on("console", console)
        page.on("pageerror", lambda exc: self.errors.append(f"{page.url}: {exc}"))
        page.on(
            "response",
            lambda r: (
                r.status >= 400
                and r.url.startswith(self.base)
                and not r.url.startswith(tuple(self.base + p for p in MLFLOW_404))
                and self.failed.append(f"{r.status} {r.url}")
            ),
        )

    def shot(self, page, name: str) -> None:
        page.screenshot(path=str(SHOTS / f"{name}.png"))

    def runs_table(self, page) -> list[str]:
        """The runs table's column ids in the order shown, once its rows are there."""
        page.wait_for_selector(".ag-row", timeout=LOADED)
        page.wait_for_timeout(1000)  # the saved column order applies just after the rows
        ids = "[...document.querySelectorAll('.ag-header-cell[col-id]')].map(e=>e.getAttribute('col-id'))"
        return page.evaluate(ids)

    def check_stage_table(self, page, stage: str, how: str) -> None:
        cols = self.runs_table(page)
        self.shot(page, f"{stage}_{how}")
        assert {"tags.`cell`", KEY_COLUMNS[stage]} <= set(cols[:8]), (how, cols)  # among the first, not MLflow's
        head = page.locator(f".ag-header-cell[col-id='{KEY_COLUMNS[stage]}']").bounding_box()
        assert head and head["x"] + head["width"] <= 1400, f"{stage}'s headline column is off-screen ({how})"
        shown = page.locator(f".ag-cell[col-id='{KEY_COLUMNS[stage]}']").all_inner_texts()
        numbers = [t for t in shown if re.fullmatch(r"[-\d.,e+]+", t.strip())]
        assert numbers, (stage, shown)
        for text in numbers:  # 4 significant digits at most, as the report shows them
            digits = text.split("e")[0].replace(",", "").replace("-", "").replace(".", "").lstrip("0")
            assert len(digits) <= 4 or "," in text, (stage, text)

    def check_seeds_under_cells(self, page) -> None:
        names = [n.strip() for n in page.locator(".ag-cell[col-id='attributes.`Run Name`'] a").all_inner_texts()]
        cell = None
        for name in names:
            seed = re.fullmatch(r"(.+) seed \d+", name)
            if seed:
                assert seed[1] == cell, f"seed run {name!r} is not under its cell's run (rows: {names})"
            else:
                cell = name.removesuffix(" (skipped)")
        assert any(" seed " in n for n in names), names

    def compares_lab_runs(self, page) -> None:
        """The report's (served by steps.ui) link to the picker; its Compare button shows the two lab
        runs' compare, the newest against the one before (the smoke store has one: the line that says so)."""
        with self.ctx.expect_page(timeout=30_000) as new:
            page.get_by_role("link", name="two lab runs side by side").click()
        picker = new.value
        picker.wait_for_load_state()
        runs = picker.locator("select[name=a] option").evaluate_all("os => os.map(o => o.value)")
        lab = api(self.base, "experiments/get-by-name", {"experiment_name": "n00bgpt/lab"})["experiment"]
        ids = api(self.base, "runs/search", {"experiment_ids": [lab["experiment_id"]]})["runs"]
        assert runs == [r["info"]["run_id"] for r in ids], runs  # every lab run, newest first (the API's order)
        assert picker.locator("select[name=a]").input_value() == runs[0]
        assert picker.locator("select[name=b]").input_value() == "previous"
        self.shot(picker, "compare_picker")
        picker.get_by_role("button", name="Compare").click()
        picker.wait_for_url(re.compile(r".*/lab/compare\?a=\w+&b=previous$"))
        shown = picker.locator("pre").inner_text()
        if len(runs) > 1:
            assert shown.startswith(f"lab run {runs[0][:8]} (") and f" vs {runs[1][:8]} (" in shown, shown
        else:
            assert shown.startswith(f"no lab run before {runs[0][:8]} ("), shown
        self.shot(picker, "compare")
        picker.close()

    def report_as_file(self, report: Path, ui_address: str) -> None:
        """index.html opened as a file: its note (visible) says to open it through `python -m steps.ui`, and
        a run link opens that UI at its default address (served here by this test's UI), not a directory."""
        base = ui_address.split("/#/")[0]
        self.ctx.route(
            f"{LOCAL_UI}/**",
            lambda route: route.fulfill(response=route.fetch(url=base + route.request.url.removeprefix(LOCAL_UI))),
        )
        page = self.ctx.new_page()
        page.goto(report.as_uri())
        note = page.locator("#n00bgpt-open")
        assert note.is_visible() and "python -m steps.ui" in note.inner_text(), note.inner_text()
        assert LOCAL_UI in note.inner_text(), note.inner_text()  # where its links go, opened as a file
        self.shot(page, "report_as_file")
        link = page.locator("h2#headline ~ * a[href*='/runs/']").first
        assert link.get_attribute("href").startswith(f"{LOCAL_UI}/#/experiments/"), link.get_attribute("href")
        self.opens_run(link.click, "report_as_file", base=LOCAL_UI)
        page.close()

    def opens_run(self, click, how: str, base: str = "") -> None:
        """`click` opens a new tab on a run's page (under `base`, default the test's UI): it shows that run."""
        with self.ctx.expect_page(timeout=30_000) as new:
            click()
        tab = new.value
        tab.wait_for_load_state()
        landed = re.match(re.escape(base or self.base) + r"/#/experiments/(\w+)/runs/(\w+)", tab.url)
        assert landed, f"{how}: landed on {tab.url}"
        run = api(self.base, "runs/get", {"run_id": landed[2]})["run"]
        tab.get_by_text(run["info"]["run_name"]).first.wait_for(timeout=LOADED)
        self.shot(tab, f"run_from_{how}")
        tab.close()


def test_a_first_time_user_clicks_through(smoke_dag):
    from playwright.sync_api import sync_playwright

    from steps.ui import free_port

    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)"
    SHOTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    ui = subprocess.Popen(
        [sys.executable, "-m", "steps.ui", "--port", str(port)],
        cwd=smoke_dag,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = ui.stdout.readline()  # printed once the server answers
        assert first.startswith("MLflow UI on "), (first, ui.stderr.read()[-3000:] if ui.poll() is not None else "")
        ui_address = first.split()[3]
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
            b = Browse(browser, base)
            b.watch(b.page)
            page = b.page

            # the experiment list -> word2vec; a run's page; back by the breadcrumb -> the list -> perf
            page.goto(ui_address)
            page.get_by_role("link", name="n00bgpt/word2vec").first.wait_for(timeout=LOADED)
            b.shot(page, "experiments")
            # the GenAI switch (its side shows every experiment as empty traces pages) is hidden
            assert page.get_by_text("Model training", exact=True).count() == 1, "MLflow's switch moved"
            assert not page.get_by_text("Model training", exact=True).is_visible(), "the GenAI switch is shown"
            page.get_by_role("link", name="n00bgpt/word2vec").first.click(timeout=LOADED)
            b.check_stage_table(page, "word2vec", "list")
            b.check_seeds_under_cells(page)
            page.locator(".ag-cell[col-id='attributes.`Run Name`'] a").first.click()
            page.wait_for_url(re.compile(r".*/runs/\w+.*"), timeout=LOADED)
            exp_id = re.search(r"#/experiments/(\w+)/", page.url)[1]
            page.locator(f"a[href$='/experiments/{exp_id}']").first.click(timeout=LOADED)  # the breadcrumb
            b.check_stage_table(page, "word2vec", "breadcrumb")
            page.get_by_role("link", name="Experiments", exact=True).first.click()
            page.get_by_role("link", name="n00bgpt/perf").first.click(timeout=LOADED)
            b.check_stage_table(page, "perf", "list")

            # the report through the UI: a run link in the headline and in two stage tables
            page.goto(f"{base}/lab/report/index.html")
            b.shot(page, "report")
            for section in ("headline", "word2vec", "perf"):
                link = page.locator(f"h2#{section} ~ * a[href*='/runs/']").first
                b.opens_run(link.click, f"report_{section}")

            # two lab runs side by side: the report's link to the picker, its Compare button
            b.compares_lab_runs(page)

            # the lab run's jobs.html artifact, in MLflow's sandboxed frame: a run in it opens
            lab = api(base, "experiments/get-by-name", {"experiment_name": "n00bgpt/lab"})["experiment"]
            [run] = api(base, "runs/search", {"experiment_ids": [lab["experiment_id"]], "max_results": 1})["runs"]
            page.goto(ui_url(base, lab["experiment_id"], run["info"]["run_id"], "jobs.html"))
            link = page.frame_locator("iframe[sandbox]").locator("a[href*='/runs/']").first
            link.wait_for(timeout=LOADED)
            b.shot(page, "jobs_html")
            b.opens_run(link.click, "jobs_html")

            # the report opened as a file (double-clicked): it says how to open it, its run links open the UI
            b.report_as_file(smoke_dag / "results" / "reports" / "index.html", ui_address)
            browser.close()
        assert not b.errors, "console errors on the lab's pages:\n" + "\n".join(b.errors)
        assert not b.failed, "requests that failed:\n" + "\n".join(b.failed)
    finally:
        ui.terminate()
        try:
            ui.wait(timeout=60)
        except subprocess.TimeoutExpired:
            ui.kill()
            ui.wait()
