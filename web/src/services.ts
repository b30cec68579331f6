// Services with their status, and their journal (followed).
import { api, enc, streamLines, vmPath } from './api';
import { clear, h, toast } from './dom';
import type { ServiceInfo, VM } from './types';

export function renderServices(el: HTMLElement, vm: VM): () => void {
  let follow: AbortController | null = null;
  const tbody = h('tbody');
  const table = h('table', { 'aria-label': 'Services' },
    h('thead', null, h('tr', null, ['Name', 'Status', 'PID', 'Restarts', 'Command', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))), tbody);
  const logTitle = h('h3', null, 'Logs');
  const log = h('pre', { class: 'log', tabindex: 0, 'aria-label': 'Service log' });

  const stopFollow = () => { follow?.abort(); follow = null; };
  const showLogs = (name: string) => {
    stopFollow();
    const ac = new AbortController();
    follow = ac;
    logTitle.textContent = `Logs of ${name} (following)`;
    log.textContent = '';
    streamLines(vmPath(vm.id, `/services/${enc(name)}/logs?follow=1&lines=200`), ac.signal, (line) => {
      log.append(line + '\n');
      if (log.childNodes.length > 5000) log.firstChild?.remove();
      log.scrollTop = log.scrollHeight;
    }).catch((e) => { if (!ac.signal.aborted) toast(`Logs of ${name}: ${(e as Error).message}`, 'error'); });
  };
  const act = (name: string, action: string) => async () => {
    try {
      if (action === 'rm') await api('DELETE', vmPath(vm.id, `/services/${enc(name)}`));
      else await api('POST', vmPath(vm.id, `/services/${enc(name)}/${action}`));
      list();
    } catch (e) { toast(`${action} ${name}: ${(e as Error).message}`, 'error'); }
  };
  const list = async () => {
    try {
      const r = await api<{ services: ServiceInfo[] }>('GET', vmPath(vm.id, '/services'));
      tbody.replaceChildren(...r.services.map((s) => h('tr', { 'data-service': s.name },
        h('td', null, s.name),
        h('td', null, h('span', { class: `badge svc-${s.active_state}` }, `${s.active_state} (${s.sub_state})`)),
        h('td', null, s.main_pid || '—'), h('td', null, s.restarts),
        h('td', { class: 'mono' }, (s.argv ?? []).join(' ')),
        h('td', null, h('div', { class: 'actions' },
          h('button', { type: 'button', class: 'small', 'aria-label': `Follow logs of ${s.name}`, onclick: () => showLogs(s.name) }, 'Logs'),
          h('button', { type: 'button', class: 'small', 'aria-label': `Restart ${s.name}`, onclick: act(s.name, 'restart') }, 'Restart'),
          s.active_state === 'active'
            ? h('button', { type: 'button', class: 'small', 'aria-label': `Stop ${s.name}`, onclick: act(s.name, 'stop') }, 'Stop')
            : h('button', { type: 'button', class: 'small', 'aria-label': `Start ${s.name}`, onclick: act(s.name, 'start') }, 'Start'))))));
      if (!r.services.length) tbody.replaceChildren(h('tr', null, h('td', { colspan: 6, class: 'muted' }, 'No services. Create one with: agentvm service create VM NAME -- CMD')));
    } catch (e) {
      tbody.replaceChildren(h('tr', null, h('td', { colspan: 6, class: 'muted' }, (e as Error).message)));
    }
  };
  const refresh = h('button', { type: 'button', onclick: () => list() }, 'Refresh');
  clear(el, h('div', { class: 'buttons' }, refresh), table, logTitle, log);
  list();
  const timer = setInterval(list, 15000);
  return () => { stopFollow(); clearInterval(timer); };
}
