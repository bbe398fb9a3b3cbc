// Run links inside MLflow's artifact view: MLflow shows an HTML artifact in a sandboxed frame (no
// popups, no top navigation, a blob: page). Open the latest lab run's jobs.html and the report run's
// index.html there, click the first run link in each, and print where it went (a new tab, or nowhere
// and the note saying how). With REPORT_FILE, also open the report as a file and print its note and links.
//
//   python -m steps.ui --port 5000 &
//   node scripts/mlflow_artifact_links.mjs http://127.0.0.1:5000 [results/reports/index.html]
import { chromium } from 'playwright-core';
import { resolve } from 'node:path';
const [base, reportFile] = process.argv.slice(2);
const api = async (path, body) => (await fetch(`${base}/api/2.0/mlflow/${path}`, {
  method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) })).json();
const exps = (await api('experiments/search', { max_results: 1000 })).experiments;
const idOf = (name) => exps.find((e) => e.name === name)?.experiment_id;
const latest = async (name) => (await api('runs/search', { experiment_ids: [idOf(name)],
  order_by: ['attributes.start_time DESC'], max_results: 1 })).runs[0].info;
const browser = await chromium.launch({ executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'] });
for (const [exp, artifact] of [['n00bgpt/lab', 'jobs.html'], ['n00bgpt/report', 'index.html']]) {
  const run = await latest(exp);
  const ctx = await browser.newContext({ viewport: { width: 1360, height: 820 } });
  const page = await ctx.newPage();
  const blocked = [];
  page.on('console', (m) => { if (/Blocked|Unsafe|Not allowed/.test(m.text())) blocked.push(m.text().slice(0, 160)); });
  const tabs = [];
  ctx.on('page', (p) => tabs.push(p));
  await page.goto(`${base}/#/experiments/${run.experiment_id}/runs/${run.run_id}/artifacts/${artifact}`);
  await page.waitForTimeout(8000);
  const frame = page.frames().find((f) => f.url().startsWith('blob:'));
  const link = frame.locator('a[href*="#/experiments/"][href*="/runs/"]').first();
  const href = await link.getAttribute('href');
  await link.click();
  await page.waitForTimeout(4000);
  const note = await frame.locator('#n00bgpt-framed').isVisible();
  console.log(JSON.stringify({ artifact, href, newTabs: tabs.map((t) => t.url()), paneStill: frame.url(),
    noteShown: note, blocked }));
  await ctx.close();
}
if (reportFile) {
  const page = await browser.newPage();
  await page.goto(`file://${resolve(reportFile)}`);
  const note = await page.locator('#n00bgpt-open').innerText();
  const href = await page.locator('a[href*="/runs/"]').first().getAttribute('href');
  console.log(JSON.stringify({ file: reportFile, note, runLink: href }));
}
await browser.close();
