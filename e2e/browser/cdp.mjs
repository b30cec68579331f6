// Drives a browser VM's Chromium from outside with the published
// puppeteer-core and playwright-core, over the DevTools protocol through
// agentvm: a preview URL of port 9222 with a token, or `agentvm connect VM
// 9222 --listen` (a plain local URL). One step per run; the Go test
// (browser_test.go) orders them around lifecycle operations and reads the
// JSON line each step prints last.
//
//   CDP_URL    http://9222-<vm>.localhost:<proxy port> or http://127.0.0.1:<port>
//   CDP_TOKEN  an agentvm token for the preview URL (none for a local forward)
//   APP_URL    the test page, served inside the VM
import './localhost.mjs';
import puppeteer from 'puppeteer-core';
import { chromium } from 'playwright-core';

const endpoint = process.env.CDP_URL;
const token = process.env.CDP_TOKEN;
const app = process.env.APP_URL;
const headers = token ? { Authorization: `Bearer ${token}` } : undefined;
// Chromium under emulation takes seconds where it takes milliseconds on
// hardware: generous protocol timeouts everywhere.
const slow = 180_000;

async function connect() {
  const t0 = Date.now();
  let ws;
  if (headers) {
    // Puppeteer fetches /json/version without headers; fetch it ourselves
    // and give the WebSocket the token.
    const r = await fetch(`${endpoint}/json/version`, { headers });
    if (!r.ok) throw new Error(`${endpoint}/json/version: HTTP ${r.status}: ${await r.text()}`);
    ws = (await r.json()).webSocketDebuggerUrl;
  }
  const browser = headers
    ? await puppeteer.connect({ browserWSEndpoint: ws, headers, protocolTimeout: slow, defaultViewport: null })
    : await puppeteer.connect({ browserURL: endpoint, protocolTimeout: slow, defaultViewport: null });
  return { browser, ws, connectMs: Date.now() - t0 };
}

// appPage finds the tab showing the app, or opens one.
async function appPage(browser, open) {
  for (const p of await browser.pages()) {
    if (p.url().startsWith(app)) {
      p.setDefaultTimeout(slow);
      found = true;
      return p;
    }
  }
  if (!open) throw new Error(`no tab shows ${app}: ${(await browser.pages()).map((p) => p.url()).join(', ')}`);
  // The blank tab of a new VM, else a new tab (a tab is a renderer process:
  // slow to start under emulation).
  const p = (await browser.pages()).find((p) => p.url() === 'about:blank') ?? await browser.newPage();
  p.setDefaultTimeout(slow);
  p.setDefaultNavigationTimeout(slow);
  await p.goto(app, { waitUntil: 'load' });
  return p;
}

// found: the app's tab was already open (after a stop and start: the session was restored).
let found = false;

async function state(p) {
  return p.evaluate(() => ({
    url: location.href,
    title: document.title,
    hello: document.querySelector('#hello')?.textContent,
    cjk: document.querySelector('#cjk')?.textContent,
    name: document.querySelector('#name')?.value,
    count: Number(document.querySelector('#count')?.textContent),
    cookie: document.cookie,
    local: localStorage.getItem('agentvm'),
  }));
}

const steps = {
  // open: connect, open the app in a tab (or find it), read its DOM.
  async open() {
    const { browser, ws, connectMs } = await connect();
    const t0 = Date.now();
    const p = await appPage(browser, true);
    await p.bringToFront();
    await p.waitForSelector('#hello', { timeout: slow });
    const s = await state(p);
    const out = { ...s, ws, connectMs, found, openMs: Date.now() - t0, version: await browser.version(), tabs: (await browser.pages()).length };
    await browser.disconnect();
    return out;
  },
  // state: read the app's tab (it must be open already).
  async state() {
    const { browser, connectMs } = await connect();
    const s = await state(await appPage(browser, false));
    await browser.disconnect();
    return { ...s, connectMs };
  },
  // type TEXT: type into the form's field, as keystrokes (not submitted).
  async type(text) {
    const { browser, connectMs } = await connect();
    const p = await appPage(browser, false);
    await p.bringToFront();
    await p.focus('#name');
    await p.keyboard.type(text);
    const s = await state(p);
    await browser.disconnect();
    return { ...s, connectMs };
  },
  // persist: a cookie and local storage, kept in the profile on disk, and a download.
  async persist() {
    const { browser } = await connect();
    const p = await appPage(browser, false);
    await p.evaluate(() => {
      document.cookie = 'agentvm=kept; max-age=86400; path=/';
      localStorage.setItem('agentvm', 'kept');
    });
    await p.click('#download');
    const s = await state(p);
    await browser.disconnect();
    return s;
  },
  // qa TEXT: submit the QA app's form and wait for the row to show.
  async qa(text) {
    const { browser } = await connect();
    const p = await appPage(browser, true);
    await p.bringToFront();
    await p.waitForSelector('#item', { timeout: slow });
    await p.type('#item', text);
    await Promise.all([p.waitForNavigation({ waitUntil: 'load', timeout: slow }), p.click('#add')]);
    await p.waitForFunction((t) => [...document.querySelectorAll('#items li')].some((li) => li.textContent === t), { timeout: slow }, text);
    const items = await p.$$eval('#items li', (lis) => lis.map((li) => li.textContent));
    const html = await p.content();
    await browser.disconnect();
    return { items, html };
  },
  // playwright: connectOverCDP as Playwright users do, and read the app's tab.
  async playwright() {
    const t0 = Date.now();
    const b = await chromium.connectOverCDP(endpoint, { headers, timeout: slow });
    const connectMs = Date.now() - t0;
    const page = b.contexts().flatMap((c) => c.pages()).find((p) => p.url().startsWith(app));
    if (!page) throw new Error(`playwright: no tab shows ${app}`);
    const hello = await page.textContent('#hello', { timeout: slow });
    // close() of a browser Playwright connected to over CDP only disconnects.
    await b.close();
    return { hello, connectMs, version: b.version() };
  },
};

const [step, ...args] = process.argv.slice(2);
if (!steps[step]) {
  console.error(`usage: node cdp.mjs ${Object.keys(steps).join('|')} [args]`);
  process.exit(2);
}
const t0 = Date.now();
const out = await steps[step](...args);
console.log(JSON.stringify({ ...out, stepMs: Date.now() - t0 }));
