// @ts-check
/**
 * The dashboard in a real browser (Debian's chromium through playwright-core) against a real cluster
 * of three `shoal node` processes on loopback: the mesh shows every node and link, the pool total is
 * the API's, the library lists SmolLM2 with the fit the API computes (and a download that cannot reach
 * the hub fails in view), the model file gamma has is copied to beta from beta's page (the cluster panel
 * names the nodes that have it, the copy row ends with its rate, the mesh shows it on the gamma–beta
 * edge), a model launched from the page splits over the three nodes and answers in the chat with its
 * rates, the Connect view's snippets answer when run as shown, and a SIGKILLed node turns red within
 * twice the failure detector's DOWN_AFTER (read from src/cluster/health.rs, the bound the Rust cluster
 * test uses) while its model is placed again on the others; the instance that replaced shows the dead
 * node's stage as down in the Ended list, and its Relaunch launches it again.
 * Screenshots go to ui/e2e/out/; the mesh with the model running also to assets/dashboard.png.
 *
 * Needs target/release/shoal built after `npm run build` (it embeds ui/dist) and the test model
 * (scripts/fetch-test-model). SHOAL_BIN and SHOAL_E2E_PORT (the lowest port tried, default 17100) override the defaults.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, copyFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { Cluster, api, freePortRange, waitFor } from './cluster.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');
const out = path.join(here, 'out');
const binary = process.env['SHOAL_BIN'] ?? path.join(repo, 'target', 'release', 'shoal');
const modelPath = path.join(repo, 'models', 'SmolLM2-135M-Instruct.Q4_1.gguf');
const modelFile = path.basename(modelPath);
/** gamma's copy of the model sits where `shoal pull` would put it, so gamma knows its repository. */
const modelFolder = 'HuggingFaceTB--SmolLM2-135M-Instruct-GGUF';
/** The first node's API port; the nodes take consecutive pairs from it (see `before`). */
let basePort = 0;
const CHROMIUM_FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/**
 * The failure detector's DOWN_AFTER in ms (src/cluster/health.rs): a peer not heard from for this long
 * is down. Read from the source the binary is built from, so the test's bound follows the detector's
 * configuration instead of a number of its own.
 */
function detectorDownAfterMs() {
  const source = readFileSync(path.join(repo, 'src', 'cluster', 'health.rs'), 'utf8');
  const found = /pub const DOWN_AFTER: Duration = Duration::from_millis\(([\d_]+)\);/.exec(source)?.[1];
  assert.ok(found, 'src/cluster/health.rs declares DOWN_AFTER as Duration::from_millis(…)');
  return Number(found.replaceAll('_', ''));
}

/** @type {Cluster | null} */
let cluster = null;
/** @type {import('playwright-core').BrowserContext | null} */
let browser = null;
/** @type {import('playwright-core').Page} */
let page;
/** @type {string} */
let profile;
/** @type {string[]} */
const pageErrors = [];

/** Stops everything this test started, also when it fails or is interrupted. */
async function cleanUp() {
  await browser?.close().catch(() => undefined);
  browser = null;
  await cluster?.stop();
  cluster = null;
  if (profile) rmSync(profile, { recursive: true, force: true });
}

for (const signal of /** @type {const} */ (['SIGINT', 'SIGTERM'])) {
  process.once(signal, () => void cleanUp().finally(() => process.exit(130)));
}

/** @param {string} name */
async function shot(name) {
  await page.screenshot({ path: path.join(out, `${name}.png`), fullPage: true });
}

/** @param {string} view */
async function open(view) {
  await page.click(`[data-testid="tab-${view}"]`);
  await page.waitForSelector(`main[data-view="${view}"]`);
}

before(async () => {
  assert.ok(existsSync(binary), `${binary} is missing: run cargo build --release (after npm --prefix ui run build)`);
  assert.ok(existsSync(modelPath), `${modelPath} is missing: run scripts/fetch-test-model`);
  mkdirSync(out, { recursive: true });
  // SmolLM2 with a 512-token context needs about 180 MB: it would fit on two 160 MB nodes, and the test
  // spreads it over all three with a layer override typed into the launch form.
  // Four nodes, two ports each; below the Rust tests' 20000-31999 and Linux's ephemeral ports.
  basePort = await freePortRange(Number(process.env['SHOAL_E2E_PORT'] ?? 17100), 8);
  cluster = new Cluster({ binary, basePort, memoryLimit: '160MB' });
  cluster.addModel('alpha', modelPath);
  cluster.placeModel('gamma', modelPath, modelFolder);
  await cluster.form(['alpha', 'beta', 'gamma']);

  const served = await (await fetch(`http://127.0.0.1:${basePort}/`)).text();
  const built = path.join(here, '..', 'dist', 'index.html');
  assert.match(served, /<div id="app">/, 'the node serves no dashboard: npm --prefix ui run build, then cargo build --release');
  if (existsSync(built)) {
    assert.equal(served, readFileSync(built, 'utf8'), 'the node serves an older dashboard than ui/dist: run cargo build --release');
  }

  profile = mkdtempSync(path.join(tmpdir(), 'shoal-ui-chromium-'));
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env['CHROMIUM'] ?? '/usr/bin/chromium',
    args: CHROMIUM_FLAGS,
    viewport: { width: 1280, height: 900 },
  });
  page = browser.pages()[0] ?? (await browser.newPage());
  page.on('pageerror', (error) => pageErrors.push(error.message));
  await page.goto(`http://127.0.0.1:${basePort}/`);
});

after(cleanUp);

test('the mesh shows every node and every link between them', async () => {
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="node-card"]').length === 3, null, { timeout: 10_000 });
  const snapshot = await api(basePort, '/api/cluster');
  const ids = snapshot.nodes.map((/** @type {any} */ n) => n.id).sort();
  const cardIds = await page.$$eval('[data-testid="node-card"]', (cards) => cards.map((c) => c.getAttribute('data-node-id')));
  assert.deepEqual([...cardIds].sort(), ids);
  const statuses = await page.$$eval('[data-testid="node-card"]', (cards) => cards.map((c) => c.getAttribute('data-status')));
  assert.deepEqual([...statuses].sort(), ['alive', 'alive', 'self']);

  await page.waitForFunction(() => document.querySelectorAll('[data-testid="link"]').length === 3, null, { timeout: 10_000 });
  const links = await page.$$eval('[data-testid="link"]', (edges) =>
    edges.map((e) => [e.getAttribute('data-a'), e.getAttribute('data-b')].sort().join(' ')),
  );
  const pairs = [];
  for (let i = 0; i < ids.length; i++) for (let j = i + 1; j < ids.length; j++) pairs.push(`${ids[i]} ${ids[j]}`);
  assert.deepEqual([...links].sort(), pairs.sort());
  // Both ends up: ok, or slow when a busy machine answers probes late (RTT p50 above 5 ms).
  const health = await page.$$eval('[data-testid="link"]', (edges) => edges.map((e) => e.getAttribute('data-health')));
  assert.ok(health.every((h) => h === 'ok' || h === 'slow'), `link health ${health.join(', ')}`);

  // No RDMA on loopback: every link is TCP, with the reason the nodes give. Each node chooses its links'
  // transports every second, always with a reason: wait until both ends of every link have reported one.
  const transports = await page.$$eval('[data-testid="link"]', (edges) => edges.map((e) => e.getAttribute('data-transport')));
  assert.deepEqual(transports, ['tcp', 'tcp', 'tcp']);
  assert.equal(await page.locator('[data-testid="transport-badge"][data-transport="tcp"]').count(), 3);
  const reasons = await waitFor(
    'every link report to carry its transport and reason',
    async () => {
      const now = await api(basePort, '/api/cluster');
      const reports = now.links.flatMap((/** @type {any} */ l) => l.reports);
      const all = reports.length === 6 && reports.every((/** @type {any} */ r) => r.transport?.kind === 'tcp' && r.transport.reason);
      return all ? reports.map((/** @type {any} */ r) => r.transport.reason) : undefined;
    },
    15_000,
  );
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="transport-detail"]').length === 3, null, { timeout: 10_000 });
  const shown = await page.$$eval('[data-testid="transport-detail"]', (rows) => rows.map((r) => r.textContent ?? ''));
  assert.ok(shown.every((text) => reasons.some((/** @type {string} */ reason) => text.includes(reason))), shown.join(' | '));
  const devices = await page.$$eval('[data-testid="node-device"]', (rows) => rows.map((r) => (r.textContent ?? '').trim()));
  assert.deepEqual(devices, ['computes on the CPU', 'computes on the CPU', 'computes on the CPU'], 'each node names its device');
  // Each link's probe times an echo of small frames after its bulk transfers: the list shows what the
  // node's own link views say.
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="link-echo"]').length === 3, null, { timeout: 30_000 });
  const echoes = await page.$$eval('[data-testid="link-echo"]', (rows) => rows.map((r) => (r.textContent ?? '').trim()));
  const measured = (await api(basePort, '/api/cluster')).links.map((/** @type {any} */ l) => l.echo_rtt_us);
  assert.ok(measured.every((/** @type {any} */ us) => Number.isInteger(us) && us > 0), `echo round trips ${measured}`);
  assert.ok(echoes.every((text) => /^echo \d+(\.\d+)? (µs|ms)$/.test(text)), echoes.join(' | '));
  await shot('mesh-3-nodes');
});

test('the pool total is the sum of memory_total of the members that are up, as /api/cluster reports', async () => {
  const snapshot = await api(basePort, '/api/cluster');
  const sum = snapshot.nodes
    .filter((/** @type {any} */ n) => ['self', 'alive', 'suspect'].includes(n.status))
    .reduce((/** @type {number} */ total, /** @type {any} */ n) => total + n.telemetry.memory_total, 0);
  assert.equal(sum, snapshot.pool.memory_total);
  const shown = Number(await page.getAttribute('[data-testid="pool-total"]', 'data-bytes'));
  assert.equal(shown, snapshot.pool.memory_total);
  const offered = Number(await page.getAttribute('[data-testid="pool-offer"]', 'data-bytes'));
  assert.ok(offered > 0 && offered <= 3 * 160_000_000, `offer ${offered}`);
  await open('memory');
  assert.equal(await page.locator('[data-testid="node-memory"]').count(), 3);
  await shot('memory');
});

test('the library lists SmolLM2 with the fit the API computes, and Launch… previews it', async () => {
  await open('models');
  const library = await api(basePort, '/api/models/fit');
  const smol = library.find((/** @type {any} */ m) => m.path === realpathSync(modelPath));
  assert.ok(smol, `SmolLM2 is not in alpha's library: ${JSON.stringify(library)}`);
  assert.equal(smol.runnable, true);
  assert.ok(smol.fit?.fits, `SmolLM2 fits three nodes offering 160 MB each: ${JSON.stringify(smol.fit)}`);
  const row = page.locator(`[data-testid="library-model"][data-path="${smol.path}"]`);
  await row.waitFor({ timeout: 10_000 });
  assert.equal(await page.locator('[data-testid="library-model"]').count(), library.length);
  assert.match(await row.innerText(), /SmolLM2-135M-Instruct\.Q4_1/, 'named as the APIs serve it');
  assert.match(await row.innerText(), /Smollm2 135M/i, "with the file's own title beside it");
  assert.match(await row.innerText(), /llama · 135 M parameters · Q4_1 · 98\.4 MB · 30 layers/);
  const fit = row.locator('[data-testid="fit"]');
  assert.equal(await fit.getAttribute('data-fits'), 'true');
  assert.equal(await fit.getAttribute('data-nodes'), String(smol.fit.nodes));
  const mb = (/** @type {number} */ bytes) => `${(bytes / 1e6).toFixed(bytes >= 1e8 ? 0 : 1)} MB`;
  assert.equal(
    (await fit.innerText()).trim(),
    `Fits on ${smol.fit.nodes} node${smol.fit.nodes === 1 ? '' : 's'}: needs ${mb(smol.fit.needed_bytes)} of the ${mb(smol.fit.pool_bytes)} the pool offers.`,
  );
  await shot('library');

  await row.locator('[data-testid="library-launch"]').click();
  assert.equal(await page.inputValue('[data-testid="model-path"]'), smol.path);
  await page.waitForSelector('[data-testid="placement-preview"]', { timeout: 15_000 });
  assert.equal(await page.locator('[data-testid="preview-stage"]').count(), smol.fit.nodes);

  // At phone width nothing in the library or the download form runs off the side.
  await page.setViewportSize({ width: 380, height: 800 });
  const overflow = await page.$$eval('[data-testid="library"], [data-testid="cluster-files"], [data-testid="pull-panel"]', (panels) =>
    panels.filter((p) => p.scrollWidth > p.clientWidth + 1).map((p) => p.getAttribute('data-testid')),
  );
  await shot('models-narrow');
  await page.setViewportSize({ width: 1280, height: 900 });
  assert.deepEqual(overflow, []);
});

test('a download is checked before it is sent, and one that cannot reach the hub fails in view', async () => {
  await open('models');
  await page.fill('[data-testid="pull-repo"]', 'https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF');
  await page.click('[data-testid="pull-button"]');
  assert.match(await page.innerText('[data-testid="pull-problem"]'), /not the whole address/);
  assert.equal(await page.locator('[data-testid="pull-row"]').count(), 0);

  // The nodes' hub is an address where nothing listens: the pull fails, and says why.
  await page.fill('[data-testid="pull-repo"]', 'HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_K_M');
  await page.click('[data-testid="pull-button"]');
  const failed = page.locator('[data-testid="pull-row"][data-state="failed"]');
  await failed.waitFor({ timeout: 20_000 });
  assert.match(await failed.locator('[data-testid="pull-failure"]').innerText(), /cannot reach 127\.0\.0\.1:9/);
  await shot('pull-failed');
});

test('a model file gamma has is copied to beta from its page, with progress, its rate and the mesh edge', async () => {
  assert.ok(cluster && browser);
  const [, beta, gamma] = cluster.nodes;
  assert.ok(beta && gamma);
  const snapshot = await api(beta.port, '/api/cluster');
  const idOf = (/** @type {string} */ name) => snapshot.nodes.find((/** @type {any} */ n) => n.name === name).id;
  // alpha offers the file it added by path too; beta has nothing.
  const lists = await api(beta.port, '/api/models/cluster');
  const holders = lists.filter((/** @type {any} */ l) => l.files.some((/** @type {any} */ f) => f.name === modelFile)).map((/** @type {any} */ l) => l.name);
  assert.deepEqual(holders.sort(), ['alpha', 'gamma']);

  const models = await browser.newPage();
  const mesh = await browser.newPage();
  for (const tab of [models, mesh]) tab.on('pageerror', (error) => pageErrors.push(error.message));
  try {
    // A second tab on beta's mesh records every copy label it shows: 98 MB over loopback take well under a second.
    await mesh.goto(`http://127.0.0.1:${beta.port}/#/mesh`);
    await mesh.waitForFunction(() => document.querySelectorAll('[data-testid="node-card"]').length === 3, null, { timeout: 10_000 });
    await mesh.evaluate(() => {
      /** @type {string[]} */
      const seen = [];
      Object.assign(window, { copyLabels: seen });
      new MutationObserver(() => {
        for (const edge of document.querySelectorAll('[data-testid="copy-edge"]')) {
          const entry = `${edge.getAttribute('data-state')}|${edge.querySelector('text')?.textContent?.trim()}`;
          if (!seen.includes(entry)) seen.push(entry);
        }
      }).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
    });

    await models.goto(`http://127.0.0.1:${beta.port}/#/models`);
    const row = models.locator(`[data-testid="cluster-file"][data-name="${modelFile}"]`);
    await row.waitFor({ timeout: 15_000 });
    assert.equal(await row.getAttribute('data-here'), 'false');
    assert.deepEqual((await row.locator('[data-testid="file-holder"]').allInnerTexts()).map((t) => t.trim()), ['alpha', 'gamma']);
    assert.match(await row.innerText(), /98\.4 MB/);
    assert.match(await row.innerText(), /HuggingFaceTB\/SmolLM2-135M-Instruct-GGUF/);
    // gamma knows the file's repository (alpha added it by path), so the copy comes from gamma.
    const button = row.locator('[data-testid="copy-here"]');
    assert.equal((await button.innerText()).trim(), 'Copy here from gamma');
    assert.equal(await button.getAttribute('data-source'), idOf('gamma'));

    // At phone width the panel and its actions stay inside it.
    await models.setViewportSize({ width: 380, height: 800 });
    const narrow = await models.$eval('[data-testid="cluster-files"]', (p) => p.scrollWidth <= p.clientWidth + 1);
    await models.setViewportSize({ width: 1280, height: 900 });
    assert.ok(narrow, 'the cluster panel runs off the side at 380 px');

    await button.click();
    const done = models.locator('[data-testid="copy-row"][data-state="done"]');
    await done.waitFor({ timeout: 30_000 });
    assert.equal((await done.getAttribute('data-file')), modelFile);
    assert.equal((await done.locator('[data-testid="copy-route"]').innerText()).replace(/\s+/g, ' ').trim(), 'gamma → beta');
    const report = await done.locator('[data-testid="copy-done"]').innerText();
    assert.match(report, /^Copied at [\d.]+ [KMG]B\/s: 98\.4 MB in [\d.]+ s/);
    assert.ok(Number(await done.locator('[data-testid="copy-done"]').getAttribute('data-rate')) > 0);
    process.stdout.write(`# ${report.split(':')[0]}\n`);

    // The file is on beta now: the panel asked again and beta holds it, and it is in beta's library.
    await models.waitForSelector(`[data-testid="cluster-file"][data-name="${modelFile}"][data-here="true"]`, { timeout: 10_000 });
    assert.deepEqual((await row.locator('[data-testid="file-holder"]').allInnerTexts()).map((t) => t.trim()), ['beta', 'alpha', 'gamma']);
    const copied = models.locator(`[data-testid="library-model"][data-path$="/${modelFolder}/${modelFile}"]`);
    await copied.waitFor({ timeout: 10_000 });
    assert.equal(await copied.getAttribute('data-runnable'), 'true');
    await models.screenshot({ path: path.join(out, 'models-copy.png'), fullPage: true });

    // The mesh drew it on the gamma–beta edge while it ran, and keeps the final rate there a while.
    const edge = mesh.locator('[data-testid="copy-edge"][data-state="done"]');
    await edge.waitFor({ timeout: 30_000 });
    assert.equal(await edge.getAttribute('data-from'), idOf('gamma'));
    assert.equal(await edge.getAttribute('data-to'), idOf('beta'));
    assert.match((await edge.locator('text').textContent()) ?? '', /^copied SmolLM2… at [\d.]+ [KMG]B\/s$/);
    const seen = /** @type {string[]} */ (await mesh.evaluate(() => /** @type {any} */ (window).copyLabels));
    assert.ok(seen.some((s) => /^copying\|copying SmolLM2… \d+ %/.test(s)), `the running copy on the mesh: ${seen.join(' / ')}`);
    process.stdout.write(`# mesh labels seen: ${seen.join(' / ')}\n`);
    await mesh.screenshot({ path: path.join(out, 'mesh-copy.png'), fullPage: true });
    // At phone width the label stays inside the picture.
    await mesh.setViewportSize({ width: 380, height: 700 });
    const inside = await mesh.$eval('[data-testid="copy-edge"] text', (text) => {
      const box = /** @type {SVGTextElement} */ (text).getBBox();
      return box.x >= 0 && box.x + box.width <= 360;
    });
    await mesh.screenshot({ path: path.join(out, 'mesh-copy-narrow.png') });
    assert.ok(inside, 'the copy label runs out of the mesh picture');
  } finally {
    await models.close();
    await mesh.close();
  }
});

test('a model launched from the page splits over the three nodes', async () => {
  await open('models');
  await page.fill('[data-testid="model-path"]', modelPath);
  await page.fill('input[placeholder="2048"]', '512');
  await page.fill('[data-testid="layers"]', 'alpha:0-9,beta:10-19,gamma:20-29');
  await page.click('[data-testid="preview-button"]');
  await page.waitForSelector('[data-testid="placement-preview"]', { timeout: 15_000 });
  assert.equal(await page.locator('[data-testid="preview-stage"]').count(), 3);
  await shot('placement-preview');
  await page.click('[data-testid="launch-button"]');
  await page.waitForSelector('[data-testid="instance"][data-state="ready"]', { timeout: 90_000 });
  const stages = await page.$$eval('[data-testid="stage"]', (rows) => rows.map((r) => r.getAttribute('data-node-id')));
  assert.equal(new Set(stages).size, 3, 'one stage on each node');
  const devices = await page.$$eval('[data-testid="stage-device"]', (cells) => cells.map((c) => c.textContent));
  assert.deepEqual(devices, ['CPU', 'CPU', 'CPU'], 'each stage says the device its node computes it on');
  await shot('models');
  await open('mesh');
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="node-layers"]').length === 3, null, { timeout: 10_000 });
});

test('a chat reply streams and shows its time to first token and rates', async () => {
  await open('chat');
  await page.fill('[data-testid="chat-max-tokens"]', '40');
  await page.fill('[data-testid="chat-input"]', 'What is the capital of France?');
  await page.click('[data-testid="chat-send"]');
  const stats = page.locator('[data-testid="chat-message"][data-role="assistant"] [data-testid="chat-stats"]');
  await stats.waitFor({ timeout: 90_000 });
  const reply = await page.locator('[data-testid="chat-message"][data-role="assistant"] .text').innerText();
  assert.ok(reply.trim().length > 0, 'the reply has text');
  assert.match(await stats.locator('[data-testid="ttft"]').innerText(), /\d/);
  assert.match(await stats.locator('[data-testid="decode-rate"]').innerText(), /\d.*tok\/s/);
  await shot('chat');
  await open('rates');
  await page.waitForSelector('[data-testid="request-row"]', { timeout: 10_000 });
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="rates-chart"]')?.getAttribute('data-samples')) >= 2);
  await shot('rates');
  await open('setup');
  await page.waitForSelector('[data-testid="doctor-node"]', { timeout: 10_000 });
  await shot('setup');
});

test('the Connect view gives snippets that answer as shown, through the official clients', async () => {
  await open('connect');
  await page.waitForSelector('[data-testid="connect-open"]');
  assert.equal(await page.locator('[data-testid="connect-model"]').inputValue(), modelFile.replace(/\.gguf$/, ''));
  for (const id of ['openai-python', 'anthropic-python', 'ollama-python']) {
    const code = await page.locator(`[data-testid="snippet-${id}"]`).innerText();
    assert.match(code, new RegExp(`127\\.0\\.0\\.1:${basePort}`), `${id} names this node`);
    const reply = execFileSync('python3', ['-'], { input: code, timeout: 90_000 }).toString();
    assert.ok(reply.trim().length > 0, `${id} printed a reply`);
  }
  await shot('connect');
});

test('the full-window dashboard screenshot, with the model running', async () => {
  await open('mesh');
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="node-layers"]').length === 3);
  await page.waitForTimeout(1500); // a couple of fresh telemetry and rates samples
  await page.screenshot({ path: path.join(out, 'dashboard.png') });
  if (process.env['SHOAL_E2E_ASSETS'] !== '0') {
    copyFileSync(path.join(out, 'dashboard.png'), path.join(repo, 'assets', 'dashboard.png'));
  }
  await page.setViewportSize({ width: 380, height: 560 });
  await shot('popover-380x560');
  await page.setViewportSize({ width: 1280, height: 900 });
});

test("a SIGKILLed node turns red within twice the detector's DOWN_AFTER, and its model is placed again on the nodes that remain", async () => {
  assert.ok(cluster);
  const victim = cluster.nodes[2];
  assert.ok(victim);
  const snapshot = await api(basePort, '/api/cluster');
  const id = snapshot.nodes.find((/** @type {any} */ n) => n.name === victim.name).id;
  const card = `[data-testid="node-card"][data-node-id="${id}"]`;
  assert.equal(await page.getAttribute(card, 'data-status'), 'alive');

  // The detector's own silence, and as much again for a busy machine (as tests/cluster.rs allows): a
  // detector twice as slow as configured, or a page that lags it by as much, is a fault, not noise.
  const downAfter = detectorDownAfterMs();
  const bound = 2 * downAfter;
  const killedAt = Date.now();
  cluster.kill(victim);
  await page.waitForSelector(`${card}[data-status="down"]`, { timeout: bound });
  const took = Date.now() - killedAt;
  const colour = await page.$eval(card, (el) => getComputedStyle(el).borderLeftColor);
  const downLinks = await page.$$eval(`[data-testid="link"][data-health="down"]`, (edges) => edges.length);
  assert.equal(downLinks, 2, 'both links of the dead node are marked down');
  await shot('node-down');
  const [r, g, b] = (colour.match(/\d+/g) ?? []).map(Number);
  assert.ok(r !== undefined && g !== undefined && b !== undefined && r > 150 && g < 110 && b < 110, `the card's edge is red, not ${colour}`);
  process.stdout.write(`# node card turned red ${took} ms after SIGKILL (bound ${bound} ms: 2 × DOWN_AFTER ${downAfter} ms)\n`);

  await waitFor('the pool to drop the dead node', async () => {
    const shown = Number(await page.getAttribute('[data-testid="pool-total"]', 'data-bytes'));
    const now = await api(basePort, '/api/cluster');
    return shown === now.pool.memory_total && now.pool.nodes_up === 2 ? true : undefined;
  }, 30_000);

  // The model the three nodes ran is placed again on the nodes that remain, by itself, and says why.
  await open('models');
  const recovered = '[data-testid="instance"][data-state="ready"] [data-testid="instance-recovery"]';
  await page.waitForSelector(recovered, { timeout: 60_000 });
  assert.match((await page.textContent(recovered)) ?? '', /node gamma is down/);
  const instances = await api(basePort, '/api/instances');
  const ready = instances.filter((/** @type {any} */ i) => i.state === 'ready');
  const shown = JSON.stringify(instances.map((/** @type {any} */ i) => ({ id: i.id, state: i.state, error: i.error, recovery: i.recovery, replaced_by: i.replaced_by, stages: i.stages.map((/** @type {any} */ s) => `${s.node_name}:${s.layers.start}-${s.layers.end}:${s.state}`) })));
  assert.equal(ready.length, 1, `one instance serves the model again: ${shown}`);
  // On alpha and beta, or on one of them alone: one node's offer is within a few MB of what the model
  // needs on a single node, and the placement uses one node when it fits.
  const nodes = ready[0].stages.map((/** @type {any} */ s) => s.node_name);
  assert.ok(nodes.length > 0 && nodes.every((/** @type {string} */ n) => n === 'alpha' || n === 'beta'), shown);
  assert.ok(instances.some((/** @type {any} */ i) => i.state === 'replaced' && i.replaced_by === ready[0].id));
  await shot('instance-recovered');

  // The instance it replaced is in the Ended list, its stages as they are now: gamma's is down, none
  // reads ready. Relaunch refuses while the model runs; once that is stopped, Relaunch launches it
  // again as it was launched, on the nodes that remain (its layers named gamma).
  const old = instances.find((/** @type {any} */ i) => i.state === 'replaced');
  const oldCard = `[data-testid="instance"][data-instance-id="${old.id}"]`;
  await page.locator('section', { has: page.locator('h2', { hasText: /^Ended$/ }) }).locator('.panel-title button').click();
  await page.waitForSelector(oldCard);
  await page.waitForSelector(`${oldCard} [data-testid="stage"][data-node-id="${id}"][data-state="failed"]`, { timeout: 10_000 });
  assert.match((await page.textContent(`${oldCard} [data-testid="stage"][data-node-id="${id}"]`)) ?? '', /node gamma is down/);
  const stageStates = await page.$$eval(`${oldCard} [data-testid="stage"]`, (rows) => rows.map((r) => r.getAttribute('data-state')));
  assert.ok(stageStates.every((s) => s === 'stopped' || s === 'failed'), `the ended instance's stages: ${stageStates}`);
  await page.click(`${oldCard} [data-testid="relaunch"]`);
  assert.match(await page.locator(`${oldCard} [data-testid="instance-action-error"]`).innerText({ timeout: 10_000 }), /already runs/);
  await shot('instance-ended');

  await page.click(`[data-testid="instance"][data-instance-id="${ready[0].id}"] button.stop`);
  await waitFor('the running instance to stop', async () => ((await api(basePort, `/api/instances/${ready[0].id}`)).state === 'stopped' ? true : undefined), 10_000);
  /** @type {string | undefined} */
  let relaunched;
  await waitFor('Relaunch to launch it again, once the stopped workers\' memory is offered again', async () => {
    await page.click(`${oldCard} [data-testid="relaunch"]`);
    const said = await page.locator(`${oldCard} [data-testid="relaunched"], ${oldCard} [data-testid="instance-action-error"]`).innerText({ timeout: 10_000 });
    relaunched = /Launched again as instance (\w+)/.exec(said)?.[1];
    return relaunched;
  }, 40_000);
  await page.waitForSelector(`[data-testid="instance"][data-instance-id="${relaunched}"][data-state="ready"]`, { timeout: 60_000 });
  const again = await api(basePort, `/api/instances/${relaunched}`);
  assert.equal(again.model, old.model);
  assert.equal(again.context, old.context);
  assert.ok(again.stages.every((/** @type {any} */ s) => s.node_name !== 'gamma'), JSON.stringify(again.stages));
  await shot('instance-relaunched');
});

test('a node with an API token asks for it once, and is read-only without it', async () => {
  assert.ok(cluster && browser);
  const guarded = cluster.start('guarded', null, ['--api-token', 'e2e-secret']);
  await cluster.healthy(guarded);
  const tab = await browser.newPage();
  tab.on('pageerror', (error) => pageErrors.push(error.message));
  try {
    await tab.goto(`http://127.0.0.1:${guarded.port}/`);
    await tab.waitForSelector('[data-testid="node-card"]');

    // Without the token the action is refused and the token is asked for; declining leaves it read-only.
    await tab.click('[data-testid="add-node"]');
    await tab.waitForSelector('[data-testid="token-input"]');
    await tab.click('text=Stay read-only');
    await tab.waitForSelector('[data-testid="read-only"]');
    assert.equal(await tab.isDisabled('[data-testid="add-node"]'), true);
    await tab.screenshot({ path: path.join(out, 'read-only.png') });

    // Offering the token afterwards unlocks the actions, and the token is kept for the next visit.
    await tab.click('[data-testid="read-only"] button');
    await tab.fill('[data-testid="token-input"]', 'e2e-secret');
    await tab.click('text=Use token');
    await tab.waitForSelector('[data-testid="read-only"]', { state: 'detached' });
    await tab.click('[data-testid="add-node"]');
    const code = await tab.locator('[data-testid="join-code"] .code').innerText({ timeout: 30_000 });
    assert.match(code, /^[A-Z0-9]{4}-[A-Z0-9]{4}$/);
    assert.equal(await tab.evaluate(() => localStorage.getItem('shoal.apiToken')), 'e2e-secret');

    // The Connect view says the token is needed, and its snippets read it from the environment.
    await tab.click('[data-testid="tab-connect"]');
    await tab.waitForSelector('[data-testid="connect-token"]');
    assert.match(await tab.locator('[data-testid="snippet-openai-python"]').innerText(), /SHOAL_API_TOKEN/);
  } finally {
    await tab.close();
  }
});

test('no script errors in the page', () => {
  assert.deepEqual(pageErrors, []);
});
