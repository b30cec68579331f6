// Exposed ports with their preview links, and the expose form.
import { api, currentSession, vmPath } from './api';
import { clear, field, h, toast } from './dom';
import type { Port, VM } from './types';

export function renderPorts(el: HTMLElement, vm: VM): () => void {
  const tbody = h('tbody');
  const table = h('table', { 'aria-label': 'Exposed ports' },
    h('thead', null, h('tr', null, ['Port', 'Kind', 'Access', 'Preview', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))), tbody);
  const port = h('input', { name: 'port', type: 'number', min: 1, max: 65535, required: true });
  const pub = h('input', { name: 'public', type: 'checkbox' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Expose');
  const form = h('form', { class: 'inline', 'aria-label': 'Expose a port' },
    field('Port in the VM', port),
    h('div', { class: 'field check' }, pub, h('label', { for: (pub.id = 'expose-public') }, 'Public (no token needed)')),
    submit);

  const list = async () => {
    try {
      const r = await api<{ ports: Port[] }>('GET', vmPath(vm.id, '/ports'));
      tbody.replaceChildren(...r.ports.map((p) => h('tr', { 'data-port': p.port },
        h('td', null, p.port), h('td', null, p.kind),
        h('td', null, p.public ? 'public' : 'private'),
        h('td', null, p.url
          ? h('a', { href: p.url, target: '_blank', rel: 'noopener noreferrer', 'data-preview': p.port }, p.url)
          : (p.host ?? '—'),
        !p.public && p.kind === 'http' ? h('small', { class: 'muted' }, ' needs a token with preview access') : null),
        h('td', null, currentSession()?.admin ? h('button', {
          type: 'button', class: 'small danger', 'aria-label': `Unexpose port ${p.port}`, onclick: async () => {
            try {
              await api('DELETE', vmPath(vm.id, `/ports/${p.port}?kind=${p.kind}`));
              list();
            } catch (e) { toast((e as Error).message, 'error'); }
          },
        }, 'Unexpose') : null))));
      if (!r.ports.length) tbody.replaceChildren(h('tr', null, h('td', { colspan: 5, class: 'muted' }, 'No ports exposed.')));
    } catch (e) {
      toast(`Ports: ${(e as Error).message}`, 'error');
    }
  };
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    submit.disabled = true;
    try {
      const p = await api<Port>('POST', vmPath(vm.id, '/ports'), { port: Number(port.value), public: pub.checked });
      toast(`Port ${p.port} exposed${p.url ? ` at ${p.url}` : ''}`);
      port.value = '';
      list();
    } catch (e) {
      toast(`Expose: ${(e as Error).message}`, 'error');
    } finally { submit.disabled = false; }
  });
  clear(el, currentSession()?.admin ? form : null, table);
  list();
  return () => {};
}
