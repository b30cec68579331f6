// The VM list: every VM (or a scoped token's one), updated live from the
// event stream, with create and the lifecycle actions.
import { api, currentSession, vmPath, ApiError } from './api';
import { actionButtons } from './actions';
import { subscribe, whenOpen } from './events';
import { clear, field, fmtAge, fmtBytes, h, toast } from './dom';
import type { AgentEvent, NetworkInfo, Snapshot, VM } from './types';

export function stateBadge(state: string): HTMLElement {
  return h('span', { class: `badge st-${state}` }, state);
}

function labelsText(l?: Record<string, string>): string {
  return Object.entries(l ?? {}).map(([k, v]) => `${k}=${v}`).join(', ');
}

export function renderVMList(main: HTMLElement): () => void {
  const s = currentSession()!;
  const rows = new Map<string, HTMLTableRowElement>();
  const tbody = h('tbody');
  const empty = h('p', { class: 'muted', hidden: true }, 'No VMs yet.');
  const table = h('table', { class: 'vms', 'aria-label': 'Virtual machines' },
    h('thead', null, h('tr', null, ['Name', 'State', 'vCPUs', 'Memory', 'Disk', 'IP', 'Age', 'Labels', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))),
    tbody);

  const renderRow = (vm: VM): HTMLTableRowElement => {
    const tr = h('tr', { 'data-vm-id': vm.id, 'data-vm-name': vm.name, 'data-state': vm.state },
      h('td', null, h('a', { href: `#/vms/${encodeURIComponent(vm.id)}` }, vm.name)),
      h('td', { class: 'state' }, stateBadge(vm.state)),
      h('td', null, vm.next_cpus ? `${vm.cpus} → ${vm.next_cpus}` : vm.cpus),
      h('td', null, fmtBytes(vm.memory_mib * 1024 * 1024)),
      h('td', null, fmtBytes(vm.disk_bytes)),
      h('td', { class: 'mono' }, vm.ip ?? '—'),
      h('td', { title: vm.created_at }, fmtAge(vm.created_at)),
      h('td', { class: 'labels' }, labelsText(vm.labels)),
      h('td', null, s.admin ? actionButtons(vm, () => refreshOne(vm.id)) : null));
    return tr;
  };

  const put = (vm: VM) => {
    const tr = renderRow(vm);
    const old = rows.get(vm.id);
    if (old) old.replaceWith(tr);
    else {
      // keep the list in creation order
      const after = [...rows.values()].find((r) => (r.dataset.created ?? '') > vm.created_at);
      tr.dataset.created = vm.created_at;
      if (after) tbody.insertBefore(tr, after); else tbody.appendChild(tr);
    }
    tr.dataset.created = vm.created_at;
    rows.set(vm.id, tr);
    empty.hidden = rows.size > 0;
  };
  const drop = (id: string) => {
    rows.get(id)?.remove();
    rows.delete(id);
    empty.hidden = rows.size > 0;
  };

  let listing: Promise<void> | null = null;
  const refreshAll = async () => {
    if (listing) return listing;
    listing = (async () => {
      try {
        const vms = s.admin ? (await api<{ vms: VM[] }>('GET', '/v1/vms')).vms : [await api<VM>('GET', vmPath(s.vm_id!))];
        const seen = new Set(vms.map((v) => v.id));
        for (const id of [...rows.keys()]) if (!seen.has(id)) drop(id);
        for (const v of vms) put(v);
      } catch (e) {
        toast(`List VMs: ${(e as Error).message}`, 'error');
      } finally {
        listing = null;
      }
    })();
    return listing;
  };
  const inflight = new Map<string, boolean>(); // id -> another refresh wanted
  const refreshOne = async (id: string) => {
    if (inflight.has(id)) { inflight.set(id, true); return; }
    inflight.set(id, false);
    try {
      do {
        inflight.set(id, false);
        try {
          put(await api<VM>('GET', vmPath(id)));
        } catch (e) {
          if (e instanceof ApiError && (e.status === 404 || e.status === 403)) drop(id);
        }
      } while (inflight.get(id));
    } finally {
      inflight.delete(id);
    }
  };
  const onEvent = (e: AgentEvent) => {
    const op = e.data?.op;
    if (!rows.has(e.vm) || op === 'fork' || op === 'create') {
      if (s.admin) refreshAll();
      return;
    }
    refreshOne(e.vm);
  };
  const unsub = subscribe(onEvent);
  const unopen = whenOpen(() => refreshAll()); // catch up after a reconnect
  // Ages tick, and a state change without an event (none is missed for
  // long) shows within half a minute.
  const timer = setInterval(() => refreshAll(), 30000);

  // A create that failed leaves no VM (the server removes what it made):
  // its row stays here, with the error and a way to retry or dismiss it.
  const failedRow = (body: Record<string, unknown>, err: string, retry: (body: Record<string, unknown>) => void) => {
    const label = typeof body.name === 'string' && body.name ? body.name : '(new VM)';
    const tr = h('tr', { 'data-state': 'failed', 'data-create-failed': label },
      h('td', null, label),
      h('td', { class: 'state' }, stateBadge('failed')),
      h('td', { colspan: 6, class: 'error', role: 'alert' }, `Create failed: ${err}`),
      h('td', null,
        h('button', { type: 'button', class: 'small', onclick: () => { tr.remove(); retry(body); } }, 'Retry'),
        h('button', { type: 'button', class: 'small', onclick: () => { tr.remove(); empty.hidden = rows.size > 0 || !!tbody.querySelector('tr'); } }, 'Dismiss')));
    tbody.appendChild(tr);
    empty.hidden = true;
  };

  clear(main,
    h('div', { class: 'titlebar' }, h('h1', null, s.admin ? 'Virtual machines' : 'Your VM')),
    s.admin ? createForm(refreshAll, failedRow) : null,
    table, empty);
  refreshAll();
  return () => { unsub(); unopen(); clearInterval(timer); };
}

function createForm(done: () => void, failed: (body: Record<string, unknown>, err: string, retry: (body: Record<string, unknown>) => void) => void): HTMLElement {
  const name = h('input', { name: 'name', autocomplete: 'off', placeholder: 'auto' });
  const cpus = h('input', { name: 'cpus', type: 'number', min: 1, value: '1' });
  const memory = h('input', { name: 'memory', value: '512M' });
  const disk = h('input', { name: 'disk', placeholder: '8G' });
  const from = h('select', { name: 'from' }, h('option', { value: '' }, '(default image)'));
  const network = h('select', { name: 'network' }, h('option', { value: '' }, '(its own)'));
  const labels = h('input', { name: 'labels', placeholder: 'team=web, env=dev' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Create VM');
  const form = h('form', { class: 'create', 'aria-label': 'Create a VM' },
    h('div', { class: 'row' },
      field('Name', name), field('vCPUs', cpus), field('Memory', memory), field('Disk', disk),
      field('From snapshot', from), field('Network', network), field('Labels', labels)),
    submit);
  const details = h('details', { class: 'panel' }, h('summary', null, 'Create a VM'), form);
  details.addEventListener('toggle', async () => {
    if (!details.open) return;
    try {
      const [snaps, nets] = await Promise.all([
        api<{ snapshots: Snapshot[] }>('GET', '/v1/snapshots'),
        api<{ networks: NetworkInfo[] }>('GET', '/v1/networks'),
      ]);
      from.replaceChildren(h('option', { value: '' }, '(default image)'), ...snaps.snapshots.map((s) => h('option', { value: s.name }, `${s.name} (from ${s.vm_name})`)));
      network.replaceChildren(h('option', { value: '' }, '(its own)'), ...nets.networks.map((n) => h('option', { value: n.name }, n.name)));
    } catch (e) {
      toast((e as Error).message, 'error');
    }
  });
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const body: Record<string, unknown> = { cpus: Number(cpus.value) || 1, memory: memory.value || '512M' };
    if (name.value) body.name = name.value.trim();
    if (disk.value) body.disk = disk.value.trim();
    if (from.value) body.from = from.value;
    if (network.value) body.network = network.value;
    const l: Record<string, string> = {};
    for (const kv of labels.value.split(',')) {
      const [k, ...v] = kv.split('=');
      if (k.trim()) l[k.trim()] = v.join('=').trim();
    }
    if (Object.keys(l).length) body.labels = l;
    name.value = '';
    await create(body);
  });
  const create = async (body: Record<string, unknown>) => {
    submit.disabled = true;
    submit.textContent = 'Creating…';
    try {
      const vm = await api<VM>('POST', '/v1/vms', body);
      toast(`Created ${vm.name} in ${(vm as unknown as { create_ms?: number }).create_ms ?? '?'} ms`);
      done();
    } catch (e) {
      toast(`Create: ${(e as Error).message}`, 'error');
      failed(body, (e as Error).message, create);
    } finally {
      submit.disabled = false;
      submit.textContent = 'Create VM';
    }
  };
  return details;
}
