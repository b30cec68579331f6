// One VM: its state and actions, and tabs for its terminal, files, ports,
// services, events, log and metrics.
import { api, ApiError, currentSession, vmPath } from './api';
import { actionButtons } from './actions';
import { renderMetrics } from './charts';
import { subscribe } from './events';
import { clear, fmtAge, fmtBytes, fmtTime, h, toast } from './dom';
import { renderChanges } from './changes';
import { renderDisplay } from './display';
import { renderFiles } from './files';
import { renderPorts } from './ports';
import { renderRecordings } from './recordings';
import { renderServices } from './services';
import { renderTerminal } from './terminal';
import { stateBadge } from './vmlist';
import type { AgentEvent, VM } from './types';

interface Tab { id: string; label: string; render: (el: HTMLElement, vm: VM) => () => void; adminOnly?: boolean; perm?: string[]; when?: (vm: VM) => boolean }

const TABS: Tab[] = [
  { id: 'terminal', label: 'Terminal', render: renderTerminal, perm: ['term'] },
  { id: 'display', label: 'Display', render: (el, vm) => renderDisplay(el, vm), perm: ['display'], when: (vm) => vm.image === 'browser' },
  { id: 'files', label: 'Files', render: (el, vm) => renderFiles(el, vm, currentSession()?.user ? `/home/${currentSession()!.user}` : '/root'), perm: ['files'] },
  { id: 'ports', label: 'Ports', render: renderPorts },
  { id: 'services', label: 'Services', render: renderServices, perm: ['exec'] },
  { id: 'events', label: 'Events', render: renderEvents, perm: ['exec', 'term', 'ssh', 'files'] },
  { id: 'changes', label: 'Changes', render: renderChanges, perm: ['files'] },
  { id: 'recordings', label: 'Recordings', render: renderRecordings, adminOnly: true },
  { id: 'log', label: 'Serial log', render: renderLog, adminOnly: true },
  { id: 'metrics', label: 'Metrics', render: renderMetrics },
];

function allowed(t: Tab): boolean {
  const s = currentSession();
  if (!s) return false;
  if (s.admin) return true;
  if (t.adminOnly) return false;
  return !t.perm || t.perm.some((p) => s.allow?.includes(p));
}

export function renderVMPage(main: HTMLElement, id: string, tabID: string): () => void {
  let vm: VM | null = null;
  let closeTab: () => void = () => {};
  const header = h('div', { class: 'vmheader' });
  const tablist = h('div', { role: 'tablist', 'aria-label': 'VM views', class: 'tabs' });
  const panel = h('div', { role: 'tabpanel', class: 'tabpanel', tabindex: 0 });
  const tabs = TABS.filter(allowed);
  const current = tabs.find((t) => t.id === tabID) ?? tabs[0];

  const drawHeader = (v: VM) => {
    clear(header,
      h('div', { class: 'titlebar' },
        h('h1', null, v.name, ' ', h('span', { class: 'state', 'data-state': v.state }, stateBadge(v.state))),
        currentSession()?.admin ? actionButtons(v, () => reload()) : null),
      h('dl', { class: 'facts' },
        fact('ID', v.id), fact('vCPUs', String(v.cpus) + (v.next_cpus ? ` (→ ${v.next_cpus} at next start)` : '')),
        fact('Memory', fmtBytes(v.memory_mib * 1048576)), fact('Disk', fmtBytes(v.disk_bytes)), fact('IP', v.ip ?? '—'),
        fact('Image', v.image ?? '—'), fact('Network', v.network || 'its own'), fact('Age', fmtAge(v.created_at)),
        v.source ? fact('Made from', v.source) : null,
        Object.keys(v.labels ?? {}).length ? fact('Labels', Object.entries(v.labels!).map(([k, x]) => `${k}=${x}`).join(', ')) : null,
        v.error ? fact('Error', v.error) : null));
  };
  const reload = async () => {
    try {
      vm = await api<VM>('GET', vmPath(id));
      drawHeader(vm);
      for (const t of tabs) { // tabs that only some images have
        const b = tablist.querySelector<HTMLElement>(`[data-tab="${t.id}"]`);
        if (b) b.hidden = !applies(t, vm);
      }
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        toast(`VM ${id} is gone`);
        location.hash = '#/';
        return;
      }
      toast((e as Error).message, 'error');
    }
  };
  const unsub = subscribe((e: AgentEvent) => { if (vm && e.vm === vm.id) reload(); });

  const select = (t: Tab) => {
    if (!vm) return;
    closeTab();
    for (const b of tablist.querySelectorAll('button')) {
      const on = b.dataset.tab === t.id;
      b.setAttribute('aria-selected', String(on));
      b.tabIndex = on ? 0 : -1;
      if (on) panel.setAttribute('aria-labelledby', b.id);
    }
    history.replaceState(null, '', `#/vms/${encodeURIComponent(id)}/${t.id}`);
    panel.dataset.tab = t.id;
    closeTab = t.render(panel, vm);
  };
  for (const t of tabs) {
    const b = h('button', { type: 'button', role: 'tab', id: `tab-${t.id}`, 'data-tab': t.id, 'aria-controls': 'vm-panel' }, t.label);
    b.addEventListener('click', () => select(t));
    // Arrow keys move between tabs (the ARIA tabs pattern).
    b.addEventListener('keydown', (ev) => {
      const shown = vm ? tabs.filter((x) => applies(x, vm!)) : tabs;
      const i = shown.indexOf(t);
      const next = ev.key === 'ArrowRight' ? shown[(i + 1) % shown.length] : ev.key === 'ArrowLeft' ? shown[(i - 1 + shown.length) % shown.length] : null;
      if (!next) return;
      ev.preventDefault();
      select(next);
      (tablist.querySelector(`[data-tab="${next.id}"]`) as HTMLElement)?.focus();
    });
    tablist.appendChild(b);
  }
  panel.id = 'vm-panel';
  clear(main, h('p', null, h('a', { href: '#/' }, '← All VMs')), header, tablist, panel);
  reload().then(() => { if (vm) select(applies(current, vm) ? current : tabs.find((t) => applies(t, vm!)) ?? current); });
  return () => { unsub(); closeTab(); };
}

function applies(t: Tab, vm: VM): boolean {
  return !t.when || t.when(vm);
}

function fact(k: string, v: string): HTMLElement[] {
  return [h('dt', null, k), h('dd', null, v)] as unknown as HTMLElement[];
}

function renderEvents(el: HTMLElement, vm: VM): () => void {
  const tbody = h('tbody');
  const row = (e: AgentEvent) => h('tr', { 'data-seq': e.seq },
    h('td', { class: 'nowrap' }, fmtTime(e.time)), h('td', null, e.type), h('td', null, e.actor), h('td', null, e.message));
  clear(el, h('table', { class: 'events', 'aria-label': 'Events' },
    h('thead', null, h('tr', null, ['Time', 'Type', 'Actor', 'Message'].map((c) => h('th', { scope: 'col' }, c)))), tbody));
  let last = 0;
  const unsub = subscribe((e) => {
    if (e.vm !== vm.id || e.seq <= last) return;
    last = e.seq;
    tbody.prepend(row(e));
  });
  (async () => {
    try {
      let after = 0;
      const all: AgentEvent[] = [];
      for (;;) { // newest 1000 at most are shown
        const r = await api<{ events: AgentEvent[] }>('GET', vmPath(vm.id, `/events?after=${after}&limit=1000`));
        all.push(...r.events);
        if (all.length > 1000) all.splice(0, all.length - 1000);
        if (r.events.length < 1000) break;
        after = r.events[r.events.length - 1].seq;
      }
      const fresh = all.filter((e) => e.seq > last);
      tbody.append(...fresh.reverse().map(row));
      if (fresh.length) last = Math.max(last, fresh[0].seq);
    } catch (e) {
      tbody.replaceChildren(h('tr', null, h('td', { colspan: 4, class: 'muted' }, (e as Error).message)));
    }
  })();
  return unsub;
}

function renderLog(el: HTMLElement, vm: VM): () => void {
  const pre = h('pre', { class: 'log', tabindex: 0, 'aria-label': 'Serial console and QEMU log' });
  const load = async () => {
    try {
      const text = await api<string>('GET', vmPath(vm.id, '/logs'));
      pre.textContent = text.length > 400000 ? text.slice(-400000) : text;
      pre.scrollTop = pre.scrollHeight;
    } catch (e) {
      pre.textContent = (e as Error).message;
    }
  };
  clear(el, h('div', { class: 'buttons' }, h('button', { type: 'button', onclick: load }, 'Refresh')), pre);
  load();
  return () => {};
}
