// CPU and memory over the last hour, as small SVG line charts (no library).
import { api, vmPath } from './api';
import { clear, fmtBytes, h } from './dom';
import type { MetricSample, VM } from './types';

const NS = 'http://www.w3.org/2000/svg';

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>, text?: string): SVGElementTagNameMap[K] {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// lineChart draws values (0..max) against time over the last hour.
function lineChart(title: string, samples: MetricSample[], value: (s: MetricSample) => number, max: number, fmt: (v: number) => string): HTMLElement {
  const W = 640, H = 180, L = 70, R = 10, T = 10, B = 24;
  const now = Date.now();
  const x = (t: number) => L + ((t - (now - 3600e3)) / 3600e3) * (W - L - R);
  const y = (v: number) => T + (1 - Math.min(v, max) / max) * (H - T - B);
  const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', class: 'chart' });
  const last = samples.length ? value(samples[samples.length - 1]) : NaN;
  root.appendChild(svg('title', {}, `${title}: ${samples.length ? fmt(last) : 'no samples yet'}`));
  for (const f of [0, 0.5, 1]) {
    root.appendChild(svg('line', { x1: L, x2: W - R, y1: y(max * f), y2: y(max * f), class: 'grid' }));
    root.appendChild(svg('text', { x: L - 6, y: y(max * f) + 4, 'text-anchor': 'end', class: 'axis' }, fmt(max * f)));
  }
  for (const m of [60, 45, 30, 15, 0]) {
    root.appendChild(svg('text', { x: x(now - m * 60e3), y: H - 6, 'text-anchor': 'middle', class: 'axis' }, m ? `-${m}m` : 'now'));
  }
  if (samples.length) {
    const pts = samples.map((s) => `${x(new Date(s.time).getTime()).toFixed(1)},${y(value(s)).toFixed(1)}`).join(' ');
    root.appendChild(svg('polyline', { points: pts, class: 'line' }));
    const lastS = samples[samples.length - 1];
    root.appendChild(svg('circle', { cx: x(new Date(lastS.time).getTime()).toFixed(1), cy: y(value(lastS)).toFixed(1), r: 3.5, class: 'dot' }));
  }
  return h('figure', { class: 'chartbox' }, h('figcaption', null, `${title}: `, h('strong', null, samples.length ? fmt(last) : '—')), root as unknown as HTMLElement);
}

export function renderMetrics(el: HTMLElement, vm: VM): () => void {
  const draw = async () => {
    try {
      const r = await api<{ samples: MetricSample[]; interval_s: number }>('GET', vmPath(vm.id, '/metrics'));
      const s = r.samples;
      const cpuMax = Math.max(100, ...s.map((m) => Math.ceil(m.cpu_percent / 50) * 50));
      const memMax = Math.max(vm.memory_mib * 1024 * 1024, ...s.map((m) => m.rss_bytes));
      clear(el,
        h('p', { class: 'muted' }, `Measured on the VM's QEMU process every ${r.interval_s || 10} s while it runs (CPU in % of one host core; memory is what the host holds for it). Last hour, kept in memory.`),
        lineChart('CPU', s, (m) => m.cpu_percent, cpuMax, (v) => `${v.toFixed(0)}%`),
        lineChart('Memory', s, (m) => m.rss_bytes, memMax, (v) => fmtBytes(v)));
    } catch (e) {
      clear(el, h('p', { class: 'muted' }, (e as Error).message));
    }
  };
  draw();
  const t = setInterval(draw, 10000);
  return () => clearInterval(t);
}
