// The host: capacity, templates (images' and built ones), snapshots, networks and tokens.
import { api } from './api';
import { confirmAction } from './dialog';
import { clear, field, fmtAge, fmtBytes, fmtTime, h, toast } from './dom';
import type { BuiltTemplate, HostInfo, NetworkInfo, Snapshot, Token, VM } from './types';

const PERMS = ['exec', 'files', 'ssh', 'term', 'preview', 'display'];

function table(label: string, cols: string[], rows: HTMLElement[], empty: string): HTMLElement {
  return h('table', { 'aria-label': label },
    h('thead', null, h('tr', null, cols.map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', null, rows.length ? rows : h('tr', null, h('td', { colspan: cols.length, class: 'muted' }, empty))));
}

export function renderHost(main: HTMLElement): () => void {
  const cap = h('section', { 'aria-labelledby': 'h-cap' });
  const tpl = h('section', { 'aria-labelledby': 'h-tpl' });
  const built = h('section', { 'aria-labelledby': 'h-built' });
  const snaps = h('section', { 'aria-labelledby': 'h-snap' });
  const nets = h('section', { 'aria-labelledby': 'h-net' });
  const toks = h('section', { 'aria-labelledby': 'h-tok' });
  let vms: VM[] = [];

  const load = async () => {
    try {
      const [host, s, n, t, v, b] = await Promise.all([
        api<HostInfo>('GET', '/v1/host'),
        api<{ snapshots: Snapshot[] }>('GET', '/v1/snapshots'),
        api<{ networks: NetworkInfo[] }>('GET', '/v1/networks'),
        api<{ tokens: Token[] }>('GET', '/v1/tokens'),
        api<{ vms: VM[] }>('GET', '/v1/vms'),
        api<{ templates: BuiltTemplate[] }>('GET', '/v1/templates'),
      ]);
      vms = v.vms;
      drawCapacity(host);
      drawTemplates(host);
      drawBuilt(b.templates);
      drawSnapshots(s.snapshots);
      drawNetworks(n.networks);
      drawTokens(t.tokens);
    } catch (e) {
      toast(`Host: ${(e as Error).message}`, 'error');
    }
  };

  const drawCapacity = (host: HostInfo) => {
    const used = host.memory_total_bytes - host.memory_available_bytes;
    const pct = host.memory_total_bytes ? Math.round((100 * host.memory_committed_bytes) / host.memory_total_bytes) : 0;
    clear(cap, h('h2', { id: 'h-cap' }, 'Capacity'),
      h('dl', { class: 'facts' },
        h('dt', null, 'Memory admitted to VMs'), h('dd', { 'data-metric': 'committed' }, `${fmtBytes(host.memory_committed_bytes)} of ${fmtBytes(host.memory_total_bytes)} (${pct}%)`),
        h('dt', null, 'Memory free'), h('dd', { 'data-metric': 'available' }, `${fmtBytes(host.memory_available_bytes)} available (${fmtBytes(used)} in use)`),
        h('dt', null, 'Disk free (data dir)'), h('dd', null, fmtBytes(host.disk_free_bytes)),
        h('dt', null, 'Running'), h('dd', { 'data-metric': 'running' }, host.running),
        h('dt', null, 'Suspended'), h('dd', { 'data-metric': 'suspended' }, host.suspended),
        h('dt', null, 'All VMs by state'), h('dd', null, Object.entries(host.vms).map(([k, n]) => `${k} ${n}`).join(', ') || 'none'),
        h('dt', null, 'Accelerator'), h('dd', null, host.accel),
        h('dt', null, 'Warm pool'), h('dd', null, Object.entries(host.warm_pool ?? {}).map(([k, n]) => `${k}: ${n}`).join(', ') || 'empty')),
      h('meter', { min: 0, max: host.memory_total_bytes, value: host.memory_committed_bytes, 'aria-label': 'Memory admitted to VMs' }));
  };
  const drawTemplates = (host: HostInfo) => {
    clear(tpl, h('h2', { id: 'h-tpl' }, 'Templates'),
      h('p', { class: 'muted' }, 'Each image and shape is cold-booted once; every create restores its template.'),
      table('Templates', ['Key', 'vCPUs', 'Memory', 'Disk', 'Accel', 'QEMU', 'Cold boot', 'Made'], host.templates.map((t) => h('tr', null,
        h('td', { class: 'mono' }, t.key.slice(0, 12)), h('td', null, t.cpus), h('td', null, fmtBytes(t.memory_mib * 1048576)),
        h('td', null, fmtBytes(t.disk_bytes)), h('td', null, t.accel), h('td', null, t.qemu_version),
        h('td', null, `${(t.cold_boot_ms / 1000).toFixed(1)} s`), h('td', null, fmtAge(t.created_at)))), 'No templates yet (the first create builds one).'));
  };
  const drawBuilt = (list: BuiltTemplate[]) => {
    const detail = h('div', { 'aria-live': 'polite' });
    clear(built, h('h2', { id: 'h-built' }, 'Built templates'),
      h('p', { class: 'muted' }, 'Built from a Dockerfile, a spec or E2B\'s Template SDK (agentvm template build); a VM made from one starts with its start command running.'),
      table('Built templates', ['Name', 'Base', 'Steps', 'Start', 'Ports', 'Size (state)', 'Shape', 'Built', 'Actions'], list.map((t) => h('tr', { 'data-template': t.name },
        h('td', null, t.name), h('td', null, t.base), h('td', null, t.steps.length),
        h('td', { class: 'mono' }, (t.start ?? []).join(' ') || '—'), h('td', null, (t.expose ?? []).join(', ') || '—'),
        h('td', null, fmtBytes(t.state_bytes)), h('td', null, `${t.cpus} vCPU, ${fmtBytes(t.memory_mib * 1048576)}`),
        h('td', { title: fmtTime(t.built_at) }, `${fmtAge(t.built_at)} (${(t.build_ms / 1000).toFixed(1)} s)`),
        h('td', null,
          h('button', {
            type: 'button', class: 'small', 'aria-label': `Steps and build log of template ${t.name}`, onclick: async () => {
              try {
                const full = await api<BuiltTemplate>('GET', `/v1/templates/${encodeURIComponent(t.name)}`);
                clear(detail, h('h3', null, `Template ${t.name}`),
                  h('h4', null, 'Steps'), h('pre', { class: 'mono', 'data-template-steps': t.name }, full.steps.join('\n')),
                  h('h4', null, 'Last build'), h('pre', { class: 'mono log', 'data-template-log': t.name }, full.build_log ?? ''));
              } catch (e) { toast((e as Error).message, 'error'); }
            },
          }, 'Log'),
          h('button', {
            type: 'button', class: 'small', 'aria-label': `New VM from template ${t.name}`, onclick: async () => {
              try { const v = await api<VM>('POST', '/v1/vms', { template: t.name }); location.hash = `#/vms/${encodeURIComponent(v.id)}`; } catch (e) { toast((e as Error).message, 'error'); }
            },
          }, 'New VM'),
          h('button', {
            type: 'button', class: 'small danger', 'aria-label': `Delete template ${t.name}`, onclick: async () => {
              if (!await confirmAction(`Delete template ${t.name}?`, 'VMs made from it keep running; its cached steps no other template uses go too.', 'Delete')) return;
              try { await api('DELETE', `/v1/templates/${encodeURIComponent(t.name)}`); load(); } catch (e) { toast((e as Error).message, 'error'); }
            },
          }, 'Delete')))), 'No built templates (agentvm template build NAME -f Dockerfile DIR).'), detail);
  };
  const drawSnapshots = (list: Snapshot[]) => {
    clear(snaps, h('h2', { id: 'h-snap' }, 'Snapshots'),
      table('Snapshots', ['Name', 'Source VM', 'Size (state)', 'Shape', 'Made', 'Actions'], list.map((s) => h('tr', { 'data-snapshot': s.name },
        h('td', null, s.name), h('td', null, s.vm_name), h('td', null, fmtBytes(s.state_bytes)),
        h('td', null, `${s.cpus} vCPU, ${fmtBytes(s.memory_mib * 1048576)}, ${fmtBytes(s.disk_bytes)} disk`),
        h('td', { title: fmtTime(s.created_at) }, fmtAge(s.created_at)),
        h('td', null, h('button', {
          type: 'button', class: 'small danger', 'aria-label': `Delete snapshot ${s.name}`, onclick: async () => {
            if (!await confirmAction(`Delete snapshot ${s.name}?`, 'VMs made from it keep working.', 'Delete')) return;
            try { await api('DELETE', `/v1/snapshots/${encodeURIComponent(s.id)}`); load(); } catch (e) { toast((e as Error).message, 'error'); }
          },
        }, 'Delete')))), 'No snapshots.'));
  };
  const drawNetworks = (list: NetworkInfo[]) => {
    const name = h('input', { name: 'network', autocomplete: 'off', required: true });
    const f = h('form', { class: 'inline', 'aria-label': 'Create a private network' }, field('New network name', name), h('button', { type: 'submit' }, 'Create network'));
    f.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      try { await api('POST', '/v1/networks', { name: name.value.trim() }); load(); } catch (e) { toast((e as Error).message, 'error'); }
    });
    clear(nets, h('h2', { id: 'h-net' }, 'Private networks'), f,
      table('Networks', ['Name', 'VMs', 'Made', 'Actions'], list.map((n) => h('tr', { 'data-network': n.name },
        h('td', null, n.name), h('td', null, n.vms.join(', ') || '—'), h('td', null, fmtAge(n.created_at)),
        h('td', null, h('button', {
          type: 'button', class: 'small danger', 'aria-label': `Delete network ${n.name}`, onclick: async () => {
            if (!await confirmAction(`Delete network ${n.name}?`, 'Refused while VMs are on it.', 'Delete')) return;
            try { await api('DELETE', `/v1/networks/${encodeURIComponent(n.name)}`); load(); } catch (e) { toast((e as Error).message, 'error'); }
          },
        }, 'Delete')))), 'No private networks.'));
  };
  const drawTokens = (list: Token[]) => {
    const vmSel = h('select', { name: 'vm', required: true }, vms.map((v) => h('option', { value: v.id }, v.name)));
    const checks = PERMS.map((p) => {
      const c = h('input', { type: 'checkbox', name: 'allow', value: p, id: `perm-${p}`, checked: true });
      return h('span', { class: 'check' }, c, h('label', { for: c.id }, p));
    });
    const user = h('input', { name: 'user', placeholder: 'any', autocomplete: 'off' });
    const ttl = h('input', { name: 'ttl', value: '1h' });
    const tname = h('input', { name: 'name', autocomplete: 'off' });
    const out = h('output', { class: 'secret', 'aria-live': 'polite' });
    const f = h('form', { 'aria-label': 'Create a scoped token' },
      h('div', { class: 'row' }, field('VM', vmSel),
        h('fieldset', { class: 'field' }, h('legend', null, 'Permissions'), checks),
        field('Guest user', user), field('Lifetime', ttl), field('Token name', tname)),
      h('button', { type: 'submit', class: 'primary' }, 'Create token'), out);
    f.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const allow = checks.map((c) => c.querySelector('input')!).filter((i) => i.checked).map((i) => i.value);
      try {
        const t = await api<Token>('POST', '/v1/tokens', { vm: vmSel.value, allow, ttl: ttl.value || undefined, user: user.value || undefined, name: tname.value || undefined });
        clear(out, 'New token (shown once): ', h('code', { 'data-token': t.id }, t.token ?? ''));
        const tokens = await api<{ tokens: Token[] }>('GET', '/v1/tokens');
        drawTokensTable(tokens.tokens);
      } catch (e) { toast((e as Error).message, 'error'); }
    });
    const tableBox = h('div');
    const drawTokensTable = (l: Token[]) => clear(tableBox, table('Tokens', ['ID', 'Name', 'VM', 'Allows', 'User', 'Expires', 'Actions'], l.map((t) => h('tr', { 'data-token-id': t.id },
      h('td', { class: 'mono' }, t.id), h('td', null, t.name ?? ''), h('td', null, vms.find((v) => v.id === t.vm_id)?.name ?? (t.vm_id || 'all (E2B key)')),
      h('td', null, t.allow?.join(', ') ?? ''), h('td', null, t.user ?? 'any'), h('td', null, fmtTime(t.expires_at)),
      h('td', null, h('button', {
        type: 'button', class: 'small danger', 'aria-label': `Revoke token ${t.id}`, onclick: async () => {
          if (!await confirmAction(`Revoke token ${t.id}?`, 'Everything it has open is closed.', 'Revoke')) return;
          try { await api('DELETE', `/v1/tokens/${encodeURIComponent(t.id)}`); load(); } catch (e) { toast((e as Error).message, 'error'); }
        },
      }, 'Revoke')))), 'No scoped tokens.'));
    drawTokensTable(list);
    clear(toks, h('h2', { id: 'h-tok' }, 'Tokens'), f, tableBox);
  };

  clear(main, h('div', { class: 'titlebar' }, h('h1', null, 'Host'), h('button', { type: 'button', onclick: () => load() }, 'Refresh')), cap, tpl, built, snaps, nets, toks);
  load();
  const t = setInterval(() => api<HostInfo>('GET', '/v1/host').then(drawCapacity).catch(() => {}), 15000);
  return () => clearInterval(t);
}
