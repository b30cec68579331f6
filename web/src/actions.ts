// The lifecycle actions of a VM, shared by the list and the VM page.
import { api, vmPath } from './api';
import { ask, confirmAction } from './dialog';
import { h, toast } from './dom';
import type { VM } from './types';

interface Action {
  label: string;
  states: string[];
  run: (vm: VM) => Promise<unknown>;
  danger?: boolean;
}

const post = (vm: VM, op: string, body?: unknown) => api('POST', vmPath(vm.id, `/${op}`), body ?? {});

const ACTIONS: Action[] = [
  { label: 'Pause', states: ['running'], run: (vm) => post(vm, 'pause') },
  { label: 'Resume', states: ['paused'], run: (vm) => post(vm, 'resume') },
  { label: 'Suspend', states: ['running', 'paused'], run: (vm) => post(vm, 'suspend') },
  { label: 'Wake', states: ['suspended'], run: (vm) => api('GET', vmPath(vm.id, '?wake=1')) },
  {
    label: 'Snapshot', states: ['running', 'paused'], run: async (vm) => {
      const v = await ask(`Snapshot ${vm.name}`, 'Captures memory, processes and disk while the VM keeps running.',
        [{ label: 'Snapshot name (optional)', name: 'name' }], 'Snapshot');
      if (!v) return null;
      const s = await post(vm, 'snapshot', v.name ? { name: v.name } : {}) as { name: string };
      toast(`Snapshot ${s.name} saved`);
      return s;
    },
  },
  {
    label: 'Fork', states: ['running', 'paused'], run: async (vm) => {
      const v = await ask(`Fork ${vm.name}`, 'Live copies with its memory, processes and files; the VM keeps running.',
        [{ label: 'Number of copies', name: 'count', type: 'number', value: '1', min: 1 }], 'Fork');
      if (!v) return null;
      const r = await post(vm, 'fork', { count: Number(v.count) || 1 }) as { children: VM[]; parent_pause_ms: number };
      toast(`Forked ${r.children.map((c) => c.name).join(', ')} (parent paused ${r.parent_pause_ms} ms)`);
      return r;
    },
  },
  {
    label: 'Resize', states: ['running', 'paused', 'stopped', 'crashed'], run: async (vm) => {
      const v = await ask(`Resize ${vm.name}`, 'Disk grows online; more vCPUs and more memory are added live; less memory applies at the next start.', [
        { label: 'vCPUs', name: 'cpus', type: 'number', value: String(vm.cpus), min: 1 },
        { label: 'Memory (MiB or 1G)', name: 'memory', value: String(vm.memory_mib) },
        { label: 'Disk (e.g. 16G)', name: 'disk', value: '' },
      ], 'Resize');
      if (!v) return null;
      const body: Record<string, unknown> = {};
      if (Number(v.cpus) && Number(v.cpus) !== vm.cpus) body.cpus = Number(v.cpus);
      if (v.memory && v.memory !== String(vm.memory_mib)) body.memory = v.memory;
      if (v.disk) body.disk = v.disk;
      return post(vm, 'resize', body);
    },
  },
  { label: 'Stop', states: ['running', 'paused', 'suspended'], run: (vm) => post(vm, 'stop') },
  { label: 'Start', states: ['stopped', 'crashed'], run: (vm) => post(vm, 'start') },
  {
    label: 'Delete', danger: true, states: ['running', 'paused', 'suspended', 'stopped', 'crashed', 'error'], run: async (vm) => {
      if (!await confirmAction(`Delete ${vm.name}?`, `The VM ${vm.name}, its disk and its tokens are deleted. This cannot be undone.`, 'Delete')) return null;
      await api('DELETE', vmPath(vm.id));
      toast(`Deleted ${vm.name}`);
      return null;
    },
  },
];

// actionButtons are the buttons for what can be done to vm now.
export function actionButtons(vm: VM, after: () => void): HTMLElement {
  const box = h('div', { class: 'actions', role: 'group', 'aria-label': `Actions for ${vm.name}` });
  for (const a of ACTIONS) {
    if (!a.states.includes(vm.state)) continue;
    const b = h('button', { type: 'button', class: a.danger ? 'danger small' : 'small', 'data-action': a.label.toLowerCase(), 'aria-label': `${a.label} ${vm.name}` }, a.label);
    b.addEventListener('click', async () => {
      b.disabled = true;
      b.setAttribute('aria-busy', 'true');
      try {
        await a.run(vm);
      } catch (e) {
        toast(`${a.label} ${vm.name}: ${(e as Error).message}`, 'error');
      } finally {
        b.disabled = false;
        b.removeAttribute('aria-busy');
        after();
      }
    });
    box.appendChild(b);
  }
  return box;
}
