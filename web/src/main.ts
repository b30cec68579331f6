// agentvm's web console: a single page on the daemon's API listener.
import './style.css';
import { currentSession, loadSession, setSession, signIn, signOut, whenSignedOut } from './api';
import { liveState, startEvents, stopEvents } from './events';
import { clear, field, h, toast } from './dom';
import { renderDisplayPage } from './display';
import { renderHost } from './host';
import { renderVMList } from './vmlist';
import { renderVMPage } from './vmpage';

const main = () => document.getElementById('main')!;
let close: () => void = () => {};

function route(): void {
  close();
  close = () => {};
  const s = currentSession();
  if (!s) { renderSignIn(); return; }
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  drawNav(parts[0] || 'vms');
  if (parts[0] === 'vms' && parts[1]) close = renderVMPage(main(), parts[1], parts[2] ?? '');
  else if (parts[0] === 'display' && parts[1]) close = renderDisplayPage(main(), parts[1]);
  else if (parts[0] === 'host' && s.admin) close = renderHost(main());
  else close = renderVMList(main());
  document.title = `agentvm — ${parts[0] === 'host' ? 'Host' : parts[1] ? parts[1] : 'VMs'}`;
}

function drawNav(active: string): void {
  const s = currentSession()!;
  const link = (href: string, label: string, id: string) =>
    h('a', { href, 'aria-current': active === id ? 'page' : null }, label);
  clear(document.getElementById('nav')!,
    link('#/', s.admin ? 'VMs' : 'My VM', 'vms'),
    s.admin ? link('#/host', 'Host', 'host') : null);
  const live = h('span', { class: 'live', title: 'Live updates', 'data-live': liveState() }, liveState() === 'live' ? '● live' : '○ connecting');
  clear(document.getElementById('who')!,
    live,
    h('span', { class: 'muted' }, s.admin ? 'admin' : `token ${s.token_id} (${(s.allow ?? []).join(', ')})`),
    h('button', { type: 'button', class: 'small', onclick: doSignOut }, 'Sign out'));
}

async function doSignOut(): Promise<void> {
  try {
    await signOut();
  } catch (e) {
    toast(`Sign-out failed, the session is still open: ${(e as Error).message}`, 'error');
    return;
  }
  document.getElementById('toast')?.replaceChildren();
  stopEvents();
  location.hash = '#/';
  route();
}

// insecure: plain HTTP from a non-loopback address.
function insecure(): boolean {
  const host = location.hostname.replace(/^\[|\]$/g, '');
  const loopback = host === 'localhost' || host.endsWith('.localhost') || /^127\./.test(host) || host === '::1';
  return location.protocol === 'http:' && !loopback;
}

function renderSignIn(message = ''): void {
  clear(document.getElementById('nav')!);
  clear(document.getElementById('who')!);
  const token = h('input', { type: 'password', name: 'token', autocomplete: 'off', required: true, spellcheck: false });
  const err = h('p', { class: 'error', role: 'alert' }, message);
  const btn = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  const form = h('form', { class: 'signin panel', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Sign in to agentvm'),
    field('API token', token, 'The admin token (<data dir>/admin.token) or a VM\'s token from `agentvm token create VM`. The daemon keeps it; this browser gets only a session id, in an HttpOnly cookie, never in the page or the URL.'),
    btn, err);
  if (insecure()) {
    form.append(h('p', { class: 'error', role: 'note', 'data-insecure': '' },
      'Warning: this page is served over plain HTTP to another host. The token you type and the session cookie cross the network unencrypted. Serve the console over TLS (a reverse proxy), on its own hostname.'));
  }
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    btn.disabled = true;
    err.textContent = '';
    try {
      await signIn(token.value.trim());
      token.value = '';
      startEvents();
      route();
    } catch (e) {
      err.textContent = (e as Error).message;
      btn.disabled = false;
      token.focus();
    }
  });
  clear(main(), form);
  token.focus();
}

async function boot(): Promise<void> {
  whenSignedOut(() => {
    stopEvents();
    close();
    close = () => {};
    renderSignIn('Your session ended (signed out elsewhere, unused for 12 hours, 7 days old, the daemon restarted, or the token was revoked or expired). Sign in again.');
  });
  window.addEventListener('hashchange', route);
  // The live indicator follows the stream.
  setInterval(() => {
    const el = document.querySelector<HTMLElement>('.live');
    if (!el) return;
    const st = liveState();
    if (el.dataset.live !== st) {
      el.dataset.live = st;
      el.textContent = st === 'live' ? '● live' : '○ connecting';
    }
  }, 1000);
  try {
    const s = await loadSession();
    if (s) startEvents();
  } catch (e) {
    toast((e as Error).message, 'error');
    setSession(null);
  }
  route();
}

boot();
