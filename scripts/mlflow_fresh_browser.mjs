// A fresh browser profile against a lab MLflow server: open the experiments list, click one
// experiment, print where it landed (runs table or GenAI overview) and the stored UI switch.
//
//   python -m steps.ui --port 5000 &   # or a plain `mlflow server` to see the difference
//   node scripts/mlflow_fresh_browser.mjs http://127.0.0.1:5000 n00bgpt/perf [shot.png]
import { chromium } from 'playwright-core';
const [base, expName = 'n00bgpt/perf', shotPath] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'] });
const ctx = await browser.newContext({ viewport: { width: 1360, height: 820 } });
const page = await ctx.newPage();
await page.goto(`${base}/#/experiments`);
await page.waitForTimeout(6000);
await page.getByRole('link', { name: expName }).first().click();
await page.waitForTimeout(8000);
const text = await page.locator('body').innerText();
const stored = await page.evaluate(() => localStorage.getItem('mlflow.workflowType_v1'));
console.log(JSON.stringify({ url: page.url(), stored,
  runsTable: /Run Name|Run name/.test(text), traces: /Traces|traces/.test(text),
  genaiOverview: /Overview/.test(text) && /Traces/.test(text) }));
if (shotPath) await page.screenshot({ path: shotPath });
await browser.close();
