// The viewer in headless Chromium (Debian's, driven by playwright-core), 1400 px wide:
// open the viewer, pick the slowest POST /checkout trace, pick its checkout span, and
// check the flamegraph shows the code that made it slow, that the slowest spans of a
// name can be listed and opened, that the lists stay inside their card (the trace
// list's last column was once drawn past the card's edge), and that the route's
// latency page draws its histogram and its slow requests' flamegraph (or says there
// are too few requests). Saves a screenshot of each page.
//
// node viewer.mjs <viewer url> <screenshot.png>
import { chromium } from 'playwright-core';

const [url, shot] = process.argv.slice(2);
if (!url || !shot) {
  console.error('usage: node viewer.mjs <viewer url> <screenshot.png>');
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
// Every cell of the trace list inside the card that holds it; the reason if not.
async function traceListOverflow(page) {
  return page.evaluate(() => {
    const pane = document.getElementById('traces-pane').getBoundingClientRect();
    const out = [...document.querySelectorAll('#traces, #traces th, #traces td, #named, #named td')]
      .map((el) => [el, el.getBoundingClientRect()])
      .filter(([, r]) => r.right > pane.right + 0.5 || r.left < pane.left - 0.5)
      .map(([el, r]) => `${el.tagName} "${el.textContent.trim().slice(0, 24)}" at ${Math.round(r.left)}-${Math.round(r.right)}`);
    return out.length === 0 ? null
      : `the trace list overflows its card (${Math.round(pane.left)}-${Math.round(pane.right)}): ${out.slice(0, 3).join('; ')}`;
  });
}

let failed = null;
const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
try {
  await page.goto(url);
  await page.locator('tr.trace-row').first().waitFor({ timeout: 15000 });
  failed = await traceListOverflow(page);
  await page.fill('#route-filter', 'POST /checkout');
  // Wait for the filtered list itself, not a row of the unfiltered one.
  await page.waitForFunction(() => {
    const roots = [...document.querySelectorAll('tr.trace-row .root-name')];
    return roots.length > 0 && roots.every((name) => name.textContent === 'POST /checkout');
  }, null, { timeout: 15000 });
  await page.locator('tr.trace-row').first().click();
  const span = page.locator('.span-row[data-name="POST /checkout"]').first();
  await span.waitFor({ timeout: 15000 });
  await span.click();
  const svg = page.frameLocator('#flame').locator('svg').first();
  await svg.waitFor({ timeout: 20000 });
  const content = await svg.innerHTML();
  await page.locator('#top tbody tr').first().waitFor({ timeout: 15000 });
  if (!/check_price_rules|CartSerializer::to_json/.test(content)) {
    failed = 'the flamegraph does not show check_price_rules or CartSerializer::to_json';
  }
  // The slowest `POST /checkout` spans (of the picked trace): one opens its trace
  // with that span picked.
  await page.fill('#span-name', 'POST /checkout');
  const hit = page.locator('#named tr.span-hit').first();
  await hit.waitFor({ timeout: 15000 });
  await hit.click();
  await page.locator('.span-row.selected[data-name="POST /checkout"]').waitFor({ timeout: 15000 });
  failed ??= await traceListOverflow(page);
  await page.screenshot({ path: shot, fullPage: true });
  // The route's latency page, from the first trace's link.
  await page.locator('tr.trace-row a.route-link').first().click();
  await page.waitForFunction(() => /requests/.test(document.getElementById('title').textContent),
    null, { timeout: 15000 });
  if (await page.locator('#note').isHidden()) {
    await page.locator('#hist div').first().waitFor({ timeout: 15000 });
    await page.locator('#rank tbody tr').first().waitFor({ timeout: 15000 });
    await page.frameLocator('#flame').locator('svg').first().waitFor({ timeout: 20000 });
  } else if (!/too few requests/.test(await page.locator('#note').textContent())) {
    failed ??= 'the route page has neither classes nor a note saying why: '
      + await page.locator('#note').textContent();
  }
  await page.screenshot({ path: shot.replace(/\.png$/, '-route.png'), fullPage: true });
} catch (e) {
  failed = String(e);
} finally {
  if (failed) await page.screenshot({ path: shot, fullPage: true });
  await browser.close();
}
if (failed) {
  console.error(failed);
  process.exit(1);
}
console.log('viewer ok: flamegraph of the slowest checkout shows its code; screenshot ' + shot);
