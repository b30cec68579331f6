// The changes tab: what changed on the VM's disk since its creation or a
// snapshot (GET /v1/vms/{id}/diff), added, changed and removed paths, each
// changed text file's unified diff shown on request.
import { api, vmPath } from './api';
import { clear, fmtBytes, h, toast } from './dom';
import type { VM } from './types';

interface DiffEntry { path: string; kind: string; size: number; old_size?: number; what?: string[]; target?: string; binary?: boolean; diff?: string; diff_note?: string }
interface DiffResponse { since: string; base: string; added: DiffEntry[]; changed: DiffEntry[]; removed: DiffEntry[]; truncated?: boolean; scanned: number; took_ms: number }

export function renderChanges(el: HTMLElement, vm: VM): () => void {
  const since = h('input', { name: 'since', value: 'create', autocomplete: 'off', 'aria-label': 'Since (create or a snapshot name)' });
  const run = h('button', { type: 'submit', class: 'primary' }, 'Compare');
  const status = h('p', { class: 'muted', 'data-diff-status': '' }, 'Reads the VM\'s disk from the host: nothing runs in the VM.');
  const list = h('div', { class: 'changes', 'aria-label': 'Changed files', role: 'region' });
  const show = (d: DiffResponse) => {
    status.textContent = `Since ${d.since} (${d.base}): ${d.added.length} added, ${d.changed.length} changed, ${d.removed.length} removed; ${d.scanned} entries read in ${d.took_ms} ms${d.truncated ? ' (more differ than listed)' : ''}.`;
    const row = (mark: string, e: DiffEntry) => {
      let desc = e.kind === 'dir' ? '/' : e.kind === 'symlink' ? ` → ${e.target ?? ''}` : '';
      if (e.what?.includes('content')) desc += ` ${fmtBytes(e.old_size)} → ${fmtBytes(e.size)}`;
      else if (e.kind === 'file') desc += ` ${fmtBytes(e.size)}`;
      if (e.what?.length) desc += ` (${e.what.join(', ')})`;
      if (e.binary) desc += ' binary';
      const item = h('li', { 'data-change': mark + ' ' + e.path }, h('code', null, `${mark} ${e.path}`), h('span', { class: 'muted' }, desc));
      if (e.diff) {
        const pre = h('pre', { class: 'unified', hidden: true }, e.diff);
        const btn = h('button', { type: 'button', class: 'small', 'aria-expanded': 'false' }, 'Diff');
        btn.addEventListener('click', () => {
          pre.hidden = !pre.hidden;
          btn.setAttribute('aria-expanded', String(!pre.hidden));
        });
        item.append(' ', btn, pre);
      }
      return item;
    };
    clear(list, h('ul', { class: 'plain' },
      ...d.added.map((e) => row('A', e)), ...d.changed.map((e) => row('M', e)), ...d.removed.map((e) => row('D', e))));
  };
  const form = h('form', { class: 'inline', 'aria-label': 'Compare the disk' }, since, run);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    run.disabled = true;
    status.textContent = 'Reading the disk…';
    try {
      const q = new URLSearchParams({ since: (since as HTMLInputElement).value.trim() || 'create', diffs: '1' });
      show(await api<DiffResponse>('GET', vmPath(vm.id, `/diff?${q}`)));
    } catch (e) {
      status.textContent = (e as Error).message;
      toast((e as Error).message, 'error');
    } finally {
      run.disabled = false;
    }
  });
  clear(el, form, status, list);
  return () => {};
}
