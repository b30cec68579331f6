// The terminal tab: xterm.js attached to the VM's persistent terminal
// sessions over the API's WebSocket (the session cookie authenticates the
// upgrade; nothing secret is in the URL).
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import { api, ApiError, enc, vmPath } from './api';
import { clear, field, h, toast } from './dom';
import { confirmAction } from './dialog';
import type { TermInfo, VM } from './types';

const encoder = new TextEncoder();

export function renderTerminal(el: HTMLElement, vm: VM): () => void {
  let ws: WebSocket | null = null;
  let term: Terminal | null = null;
  let fit: FitAddon | null = null;
  let ro: ResizeObserver | null = null;
  let current = '';

  const sessions = h('ul', { class: 'sessions', 'aria-label': 'Terminal sessions' });
  const nameInput = h('input', { name: 'session', value: 'main', autocomplete: 'off' });
  const openBtn = h('button', { type: 'submit', class: 'primary' }, 'Open');
  const form = h('form', { class: 'inline', 'aria-label': 'Open a terminal session' }, field('Session name', nameInput), openBtn);
  const status = h('span', { class: 'muted', 'data-term-status': '' }, 'Not attached');
  const detachBtn = h('button', { type: 'button', disabled: true }, 'Detach');
  const killBtn = h('button', { type: 'button', class: 'danger', disabled: true }, 'Kill session');
  const screen = h('div', { class: 'term', 'aria-label': 'Terminal', role: 'region' });

  const listSessions = async () => {
    try {
      const r = await api<{ terminals: TermInfo[] }>('GET', vmPath(vm.id, '/terminals'));
      sessions.replaceChildren(...r.terminals.map((t) => h('li', null,
        h('button', { type: 'button', class: 'small', 'data-session': t.name, 'aria-label': `Attach to session ${t.name}`, onclick: () => attach(t.name) }, t.name),
        h('span', { class: 'muted' }, ` ${t.user}, ${t.clients} attached${t.exited ? ', exited' : ''}`))));
      if (!r.terminals.length) sessions.replaceChildren(h('li', { class: 'muted' }, 'No sessions yet.'));
    } catch (e) {
      sessions.replaceChildren(h('li', { class: 'muted' }, (e as Error).message));
    }
  };

  const detach = () => {
    ws?.close();
    ws = null;
    ro?.disconnect();
    ro = null;
    term?.dispose();
    term = null;
    current = '';
    status.textContent = 'Not attached';
    detachBtn.disabled = killBtn.disabled = true;
    screen.replaceChildren();
    window.removeEventListener('resize', onWindowResize);
  };
  const onWindowResize = () => fit?.fit();

  // OSC 8 hyperlinks the program in the VM prints: http(s) only (no
  // javascript:, data:, file: or custom schemes), confirmed with the real
  // address (the link's text may say anything), opened without an opener.
  const linkHandler = {
    allowNonHttpProtocols: false,
    activate: (_ev: MouseEvent, text: string) => {
      let u: URL;
      try { u = new URL(text); } catch { return; }
      if (u.protocol !== 'http:' && u.protocol !== 'https:') return;
      if (window.confirm(`Open ${u.href} from the terminal?`)) window.open(u.href, '_blank', 'noopener,noreferrer');
    },
  };

  const attach = async (name: string) => {
    detach();
    const t = new Terminal({ cursorBlink: true, scrollback: 10000, fontFamily: 'DejaVu Sans Mono, Liberation Mono, monospace', fontSize: 14, convertEol: false, linkHandler });
    const f = new FitAddon();
    t.loadAddon(f);
    t.open(screen);
    f.fit();
    term = t; fit = f; current = name;
    try {
      let info: TermInfo | null = null;
      try {
        info = await api<TermInfo>('GET', vmPath(vm.id, `/terminals/${enc(name)}`));
      } catch (e) {
        if (!(e instanceof ApiError && e.status === 404)) throw e;
      }
      if (info?.exited) {
        await api('DELETE', vmPath(vm.id, `/terminals/${enc(name)}`));
        info = null;
      }
      if (!info) {
        try {
          await api('POST', vmPath(vm.id, '/terminals'), { name, cols: t.cols, rows: t.rows, env: { TERM: 'xterm-256color' } });
        } catch (e) {
          if (!(e instanceof ApiError && e.status === 409)) throw e;
        }
      }
    } catch (e) {
      toast(`Terminal ${name}: ${(e as Error).message}`, 'error');
      detach();
      return;
    }
    if (current !== name) return;
    const proto = location.protocol === 'https:' ? 'wss' : 'ws';
    const sock = new WebSocket(`${proto}://${location.host}${vmPath(vm.id, `/terminals/${enc(name)}`)}?cols=${t.cols}&rows=${t.rows}`);
    sock.binaryType = 'arraybuffer';
    ws = sock;
    status.textContent = `Connecting to ${name}…`;
    sock.onopen = () => {
      status.textContent = `Attached to ${name}`;
      screen.dataset.session = name;
      detachBtn.disabled = killBtn.disabled = false;
      t.focus();
      listSessions();
    };
    sock.onmessage = (m) => {
      if (typeof m.data === 'string') {
        try {
          const c = JSON.parse(m.data);
          if (c.type === 'exit') t.write(`\r\n[session ended: exit code ${c.exit_code}${c.signal ? `, ${c.signal}` : ''}]\r\n`);
        } catch { /* ignore */ }
        return;
      }
      t.write(new Uint8Array(m.data as ArrayBuffer));
    };
    sock.onclose = () => {
      if (ws === sock) {
        status.textContent = `Disconnected from ${name}`;
        detachBtn.disabled = true;
      }
    };
    t.onData((d) => { if (sock.readyState === WebSocket.OPEN) sock.send(encoder.encode(d)); });
    t.onBinary((d) => {
      if (sock.readyState !== WebSocket.OPEN) return;
      const b = new Uint8Array(d.length);
      for (let i = 0; i < d.length; i++) b[i] = d.charCodeAt(i) & 0xff;
      sock.send(b);
    });
    t.onResize(({ cols, rows }) => {
      if (sock.readyState === WebSocket.OPEN) sock.send(JSON.stringify({ type: 'resize', cols, rows }));
    });
    // The terminal follows its box: the window, and the layout around it.
    ro = new ResizeObserver(() => f.fit());
    ro.observe(screen);
    window.addEventListener('resize', onWindowResize);
  };

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const n = nameInput.value.trim();
    if (n) attach(n);
  });
  detachBtn.addEventListener('click', () => { detach(); listSessions(); });
  killBtn.addEventListener('click', async () => {
    const n = current;
    if (!n || !await confirmAction(`Kill session ${n}?`, 'Its programs are ended.', 'Kill')) return;
    detach();
    try { await api('DELETE', vmPath(vm.id, `/terminals/${enc(n)}`)); } catch (e) { toast((e as Error).message, 'error'); }
    listSessions();
  });

  clear(el,
    h('div', { class: 'termbar' }, form, h('div', { class: 'buttons' }, detachBtn, killBtn, status)),
    h('h3', { class: 'sr-only' }, 'Sessions'), sessions, screen,
    h('p', { class: 'muted small' }, 'Sessions keep running when you detach or close the page; reattaching replays the recent output.'));
  listSessions();
  return detach;
}
