// The recordings tab (admin only): a VM's terminal sessions and execs as
// the daemon recorded them. A terminal's asciicast v2 file plays back in
// xterm.js with its own timing (pauses longer than 2 s shortened, a speed
// choice); an exec shows its record.
import { Terminal } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';
import { api, enc, raw, vmPath } from './api';
import { clear, fmtBytes, fmtTime, h, toast } from './dom';
import type { VM } from './types';

interface Recording {
  id: string; kind: 'terminal' | 'exec'; title: string; user?: string; actor?: string;
  start: string; duration_ms: number; bytes: number; exit_code?: number; cut?: boolean;
}

// castEvents parses an asciicast v2 file: its header and its events.
export function castEvents(text: string): { width: number; height: number; events: [number, string, string][] } {
  const lines = text.split('\n').filter((l) => l.trim() !== '');
  const head = JSON.parse(lines[0] ?? '{}') as { width?: number; height?: number };
  const events: [number, string, string][] = [];
  for (const l of lines.slice(1)) {
    try {
      const e = JSON.parse(l) as [number, string, string];
      if (Array.isArray(e) && e.length === 3) events.push(e);
    } catch { /* a line cut by a crash: skip it */ }
  }
  return { width: head.width ?? 80, height: head.height ?? 24, events };
}

export function renderRecordings(el: HTMLElement, vm: VM): () => void {
  let stop = () => {};
  const list = h('table', { class: 'events', 'aria-label': 'Recordings' });
  const status = h('p', { class: 'muted', 'data-rec-status': '' });
  const player = h('div', { class: 'player' });
  const toggle = h('button', { type: 'button' }, '…');
  let enabled = true;

  const play = async (r: Recording) => {
    stop();
    const text = await (await raw('GET', vmPath(vm.id, `/recordings/${enc(r.id)}`))).text();
    if (r.kind === 'exec') {
      clear(player, h('pre', { class: 'exec-record', 'data-exec-record': r.id }, JSON.stringify(JSON.parse(text), null, 2)));
      return;
    }
    const cast = castEvents(text);
    const screen = h('div', { class: 'term', 'aria-label': `Recording ${r.id}`, 'data-playback': r.id });
    const speed = h('select', { 'aria-label': 'Speed' }, ...['1', '2', '4', '16'].map((s) => h('option', { value: s }, `${s}x`)));
    const state = h('span', { class: 'muted', 'data-playback-state': '' }, 'playing');
    clear(player, h('div', { class: 'inline' }, speed, state), screen);
    const term = new Terminal({ cols: cast.width, rows: cast.height, convertEol: false, disableStdin: true });
    term.open(screen);
    let i = 0, timer = 0, clock = 0;
    const step = () => {
      const x = Number((speed as HTMLSelectElement).value) || 1;
      while (i < cast.events.length) {
        const [t, type, data] = cast.events[i];
        if (t - clock > 2) clock = t - 2; // long idle stretches shortened to 2 s
        const wait = (t - clock) / x;
        if (wait > 0.01) {
          clock += wait * x;
          timer = window.setTimeout(step, wait * 1000);
          return;
        }
        clock = Math.max(clock, t);
        if (type === 'o') term.write(data);
        if (type === 'r') {
          const [c, rows] = data.split('x').map(Number);
          if (c > 0 && rows > 0) term.resize(c, rows);
        }
        if (type === 'm') term.write(`\r\n[${data}]\r\n`);
        i++;
      }
      state.textContent = 'ended';
      screen.dataset.ended = '1';
    };
    step();
    stop = () => { window.clearTimeout(timer); term.dispose(); };
  };

  const load = async () => {
    try {
      const r = await api<{ enabled: boolean; recordings: Recording[] }>('GET', vmPath(vm.id, '/recordings'));
      enabled = r.enabled;
      toggle.textContent = enabled ? 'Stop recording' : 'Record again';
      status.textContent = enabled ? `Recording this VM's terminals and execs. ${r.recordings.length} kept.` : 'Recording is off for this VM.';
      clear(list, h('tr', null, h('th', null, 'Start'), h('th', null, 'Kind'), h('th', null, 'What'), h('th', null, 'By'), h('th', null, 'Size'), h('th', null, '')),
        ...r.recordings.slice().reverse().map((x) => h('tr', null,
          h('td', null, fmtTime(x.start)), h('td', null, x.kind),
          h('td', null, x.title + (x.exit_code !== undefined ? ` → exit ${x.exit_code}` : '') + (x.cut ? ' (cut)' : '')),
          h('td', null, x.actor ?? ''), h('td', null, fmtBytes(x.bytes)),
          h('td', null, h('button', { type: 'button', class: 'small', 'data-recording': x.id, onclick: () => play(x).catch((e) => toast((e as Error).message, 'error')) },
            x.kind === 'terminal' ? 'Play' : 'Show')))));
    } catch (e) {
      status.textContent = (e as Error).message;
    }
  };
  toggle.addEventListener('click', async () => {
    try {
      await api('POST', vmPath(vm.id, '/recordings/settings'), { enabled: !enabled });
      await load();
    } catch (e) {
      toast((e as Error).message, 'error');
    }
  });
  const exportLink = h('a', { href: `/v1/vms/${enc(vm.id)}/recordings/export`, download: `${vm.name}-recordings.tar.gz` }, 'Export (.tar.gz)');
  clear(el, h('div', { class: 'inline' }, toggle, exportLink), status, list, player);
  load();
  return () => stop();
}
