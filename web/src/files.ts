// The file browser: list, download, upload with progress, edit small text files.
import { api, csrfHeaders, vmPath } from './api';
import { clear, field, fmtBytes, fmtTime, h, toast } from './dom';
import { confirmAction } from './dialog';
import type { FileInfo, VM } from './types';

const EDIT_MAX = 256 * 1024;

const fileURL = (vm: VM, p: string) => vmPath(vm.id, `/files?path=${encodeURIComponent(p)}`);

function join(dir: string, name: string): string {
  return dir.endsWith('/') ? dir + name : `${dir}/${name}`;
}

function parent(p: string): string {
  const t = p.replace(/\/+$/, '');
  const i = t.lastIndexOf('/');
  return i <= 0 ? '/' : t.slice(0, i);
}

export function renderFiles(el: HTMLElement, vm: VM, start = '/root'): () => void {
  let dir = start;
  const pathInput = h('input', { name: 'path', value: dir, autocomplete: 'off', class: 'mono' });
  const go = h('button', { type: 'submit' }, 'Go');
  const up = h('button', { type: 'button', 'aria-label': 'Parent directory' }, 'Up');
  const nav = h('form', { class: 'inline', 'aria-label': 'Directory' }, field('Path', pathInput), go, up);
  const upload = h('input', { type: 'file', name: 'upload', multiple: true });
  const progress = h('progress', { max: 100, value: 0, hidden: true, 'aria-label': 'Upload progress' });
  const progressText = h('span', { class: 'muted', 'aria-live': 'polite' });
  const tbody = h('tbody');
  const table = h('table', { class: 'files', 'aria-label': 'Files' },
    h('thead', null, h('tr', null, ['Name', 'Size', 'Owner', 'Modified', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))), tbody);
  const editor = h('div', { class: 'editor' });

  const list = async (p: string) => {
    try {
      const r = await api<{ path: string; entries: FileInfo[] }>('GET', vmPath(vm.id, `/files/list?path=${encodeURIComponent(p)}`));
      dir = r.path || p;
      pathInput.value = dir;
      const entries = [...r.entries].sort((a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name));
      tbody.replaceChildren(...entries.map((f) => {
        const full = join(dir, f.name);
        const name = f.type === 'dir'
          ? h('button', { type: 'button', class: 'link', onclick: () => list(full) }, `${f.name}/`)
          : h('span', null, f.name, f.link_target ? h('span', { class: 'muted' }, ` → ${f.link_target}`) : null);
        const acts = h('div', { class: 'actions' });
        if (f.type === 'file') {
          acts.append(h('a', { href: fileURL(vm, full), download: f.name, class: 'button small', 'aria-label': `Download ${f.name}` }, 'Download'));
          if (f.size <= EDIT_MAX) acts.append(h('button', { type: 'button', class: 'small', 'aria-label': `Edit ${f.name}`, onclick: () => edit(full) }, 'Edit'));
        }
        {
          acts.append(h('button', {
            type: 'button', class: 'small danger', 'aria-label': `Delete ${f.name}`, onclick: async () => {
              if (!await confirmAction(`Delete ${f.name}?`, full, 'Delete')) return;
              try {
                await api('DELETE', fileURL(vm, full) + (f.type === 'dir' ? '&recursive=1' : ''));
                list(dir);
              } catch (e) { toast((e as Error).message, 'error'); }
            },
          }, 'Delete'));
        }
        return h('tr', { 'data-file': f.name },
          h('td', null, name), h('td', null, f.type === 'dir' ? '—' : fmtBytes(f.size)),
          h('td', null, f.owner ?? ''), h('td', null, fmtTime(f.mtime)), h('td', null, acts));
      }));
    } catch (e) {
      toast(`List ${p}: ${(e as Error).message}`, 'error');
    }
  };

  const edit = async (p: string) => {
    try {
      const text = await (await fetch(fileURL(vm, p), { credentials: 'same-origin', cache: 'no-store', headers: csrfHeaders() })).text();
      const area = h('textarea', { rows: 20, spellcheck: false, class: 'mono' });
      area.value = text;
      const save = h('button', { type: 'submit', class: 'primary' }, 'Save');
      const cancel = h('button', { type: 'button', onclick: () => editor.replaceChildren() }, 'Close');
      const f = h('form', { 'aria-label': `Edit ${p}` }, field(`Contents of ${p}`, area), h('div', { class: 'buttons' }, save, cancel));
      // A PUT of the raw text (not JSON).
      f.onsubmit = async (ev) => {
        ev.preventDefault();
        save.disabled = true;
        try {
          const r = await fetch(fileURL(vm, p), { method: 'PUT', credentials: 'same-origin', headers: { ...csrfHeaders(), 'Content-Type': 'application/octet-stream' }, body: area.value });
          if (!r.ok) throw new Error((await r.json().catch(() => null))?.error?.message ?? r.statusText);
          toast(`Saved ${p}`);
          list(dir);
        } catch (e) {
          toast(`Save ${p}: ${(e as Error).message}`, 'error');
        } finally { save.disabled = false; }
      };
      editor.replaceChildren(f);
      area.focus();
    } catch (e) {
      toast(`Open ${p}: ${(e as Error).message}`, 'error');
    }
  };

  const put = (file: File, target: string) => new Promise<void>((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('PUT', fileURL(vm, target));
    for (const [k, v] of Object.entries(csrfHeaders())) xhr.setRequestHeader(k, v);
    xhr.setRequestHeader('Content-Type', 'application/octet-stream');
    progress.hidden = false;
    xhr.upload.onprogress = (e) => {
      if (!e.lengthComputable) return;
      progress.value = Math.round((100 * e.loaded) / e.total);
      progressText.textContent = `${file.name}: ${fmtBytes(e.loaded)} of ${fmtBytes(e.total)}`;
    };
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve();
      else {
        let msg = xhr.statusText;
        try { msg = JSON.parse(xhr.responseText).error.message; } catch { /* not JSON */ }
        reject(new Error(msg));
      }
    };
    xhr.onerror = () => reject(new Error('network error'));
    xhr.send(file);
  });

  upload.addEventListener('change', async () => {
    for (const f of Array.from(upload.files ?? [])) {
      try {
        await put(f, join(dir, f.name));
        progressText.textContent = `Uploaded ${f.name} (${fmtBytes(f.size)})`;
        toast(`Uploaded ${f.name}`);
      } catch (e) {
        progressText.textContent = `Upload of ${f.name} failed`;
        toast(`Upload ${f.name}: ${(e as Error).message}`, 'error');
      }
    }
    upload.value = '';
    progress.hidden = true;
    list(dir);
  });
  nav.addEventListener('submit', (ev) => { ev.preventDefault(); list(pathInput.value.trim() || '/'); });
  up.addEventListener('click', () => list(parent(dir)));

  clear(el, nav, h('div', { class: 'inline' }, field('Upload files here', upload), progress, progressText), table, editor);
  list(dir);
  return () => {};
}
