// The display of a browser VM: a live, interactive view (noVNC over the
// API's VNC WebSocket; the session cookie authenticates the upgrade, so no
// token is in the URL) and screenshots. Also a page of its own,
// #/display/<vm>, for a token that may only look at the display.
import RFB from '@novnc/novnc/core/rfb.js';
import { api, vmPath } from './api';
import { clear, h, toast } from './dom';
import type { VM } from './types';

export function renderDisplay(el: HTMLElement, vm: VM, standalone = false): () => void {
  let rfb: RFB | null = null;
  const status = h('span', { class: 'muted', 'data-display-status': '', role: 'status' }, 'Not connected');
  const screen = h('div', { class: standalone ? 'display standalone' : 'display', role: 'application', 'aria-label': `Display of ${vm.name}` });
  const viewOnly = h('input', { type: 'checkbox', id: 'display-viewonly' });
  const fit = h('input', { type: 'checkbox', id: 'display-fit', checked: true });
  const reconnect = h('button', { type: 'button' }, 'Reconnect');
  const shot = h('a', { class: 'button', href: vmPath(vm.id, '/screenshot'), download: `${vm.name}.png` }, 'Save screenshot');
  const paste = h('button', { type: 'button', title: 'Send the text of your clipboard to the VM\'s clipboard' }, 'Paste clipboard');

  const connect = () => {
    rfb?.disconnect();
    screen.replaceChildren();
    const proto = location.protocol === 'https:' ? 'wss' : 'ws';
    const r = new RFB(screen, `${proto}://${location.host}${vmPath(vm.id, '/vnc')}`, { shared: true, wsProtocols: ['binary'] });
    r.scaleViewport = fit.checked;
    r.viewOnly = viewOnly.checked;
    r.background = 'transparent';
    r.qualityLevel = 6;
    r.compressionLevel = 2;
    rfb = r;
    status.textContent = `Connecting to ${vm.name}…`;
    r.addEventListener('connect', () => {
      status.textContent = `Live: ${vm.name}`;
      screen.dataset.connected = 'true';
      r.focus();
    });
    r.addEventListener('disconnect', (ev: Event) => {
      if (rfb !== r) return;
      screen.dataset.connected = 'false';
      const clean = (ev as CustomEvent<{ clean: boolean }>).detail?.clean;
      status.textContent = clean ? 'Disconnected' : 'Disconnected (the VM is not reachable, or has no display)';
    });
  };
  viewOnly.addEventListener('change', () => { if (rfb) rfb.viewOnly = viewOnly.checked; });
  fit.addEventListener('change', () => { if (rfb) rfb.scaleViewport = fit.checked; });
  reconnect.addEventListener('click', connect);
  paste.addEventListener('click', async () => {
    try {
      rfb?.clipboardPasteFrom(await navigator.clipboard.readText());
    } catch (e) {
      toast(`Clipboard: ${(e as Error).message}`, 'error');
    }
  });

  const bar = h('div', { class: 'buttons' },
    h('label', { class: 'check' }, viewOnly, 'View only'),
    h('label', { class: 'check' }, fit, 'Fit to window'),
    reconnect, shot, paste,
    standalone ? h('a', { href: `#/vms/${encodeURIComponent(vm.id)}/display` }, 'VM page') : h('a', { href: `#/display/${encodeURIComponent(vm.name)}` }, 'Open on its own'),
    status);
  clear(el, bar, screen,
    standalone ? null : h('p', { class: 'muted small' }, 'Chromium runs on this display; programs drive it through the DevTools protocol on port 9222 while you watch or take over here.'));
  connect();
  return () => {
    rfb?.disconnect();
    rfb = null;
  };
}

// renderDisplayPage is #/display/<vm>: the display alone.
export function renderDisplayPage(main: HTMLElement, ref: string): () => void {
  let close: () => void = () => {};
  let gone = false;
  clear(main, h('p', { class: 'muted' }, 'Loading…'));
  (async () => {
    try {
      const vm = await api<VM>('GET', vmPath(ref));
      if (gone) return;
      const box = h('div');
      clear(main, h('h1', null, `Display of ${vm.name}`), box);
      close = renderDisplay(box, vm, true);
    } catch (e) {
      toast((e as Error).message, 'error');
      clear(main, h('p', { class: 'error' }, (e as Error).message));
    }
  })();
  return () => { gone = true; close(); };
}
