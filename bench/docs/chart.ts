// SVG charts for docs/benchmarks.md, written by hand (no dependency) and deterministic, so the
// --check mode can compare them byte for byte. Bars: one per figure, each scaled against the
// largest figure of the same unit in its family (mixed units never share a scale).
import type { Family } from './families.js';
import { num, xml } from './format.js';

const WIDTH = 760;
const LABEL = 400;
const BAR = 250;
const ROW = 22;

export function barChart(fam: Family): string {
  const bars = fam.figures
    .map((f) => ({ name: f.name, unit: f.unit, v: f.p50 ?? f.value }))
    .filter((b): b is { name: string; unit: string; v: number } => b.v !== undefined && Number.isFinite(b.v) && b.v >= 0);
  const maxByUnit = new Map<string, number>();
  for (const b of bars) maxByUnit.set(b.unit, Math.max(maxByUnit.get(b.unit) ?? 0, b.v));
  const height = 40 + bars.length * ROW + 20;
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="${WIDTH}" height="${height}" fill="#ffffff"/>`,
    `<text x="10" y="20" font-size="14" font-weight="bold">${xml(fam.title)}</text>`,
    `<text x="10" y="34" fill="#555555">${xml(`${fam.date}, ${fam.machine}`.slice(0, 120))}</text>`,
  ];
  bars.forEach((b, i) => {
    const y = 44 + i * ROW;
    const max = maxByUnit.get(b.unit) || 1;
    const w = Math.max(1, Math.round((b.v / max) * BAR));
    const label = b.name.length > 62 ? `${b.name.slice(0, 60)}...` : b.name;
    out.push(
      `<text x="10" y="${y + 14}">${xml(label)}</text>`,
      `<rect x="${LABEL}" y="${y + 3}" width="${w}" height="${ROW - 8}" fill="#4a7bb7"/>`,
      `<text x="${LABEL + w + 6}" y="${y + 14}">${xml(`${num(b.v)} ${b.unit}`.trim())}</text>`,
    );
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}

const COLORS = ['#4a7bb7', '#d0743c', '#5a9f5a'];

/** Samples over time: each line scaled to its own maximum (the legend gives it). */
export function lineChart(fam: Family): string {
  const s = fam.series!;
  const height = 260;
  const x0 = 50;
  const plotW = WIDTH - x0 - 20;
  const plotH = 170;
  const y0 = 50;
  const tMax = Math.max(...s.t, 1);
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="${WIDTH}" height="${height}" fill="#ffffff"/>`,
    `<text x="10" y="20" font-size="14" font-weight="bold">${xml(fam.title)}</text>`,
    `<text x="10" y="34" fill="#555555">${xml(`${fam.date}, ${fam.machine}`.slice(0, 120))}</text>`,
    `<line x1="${x0}" y1="${y0 + plotH}" x2="${x0 + plotW}" y2="${y0 + plotH}" stroke="#999999"/>`,
    `<text x="${x0}" y="${y0 + plotH + 16}">0 s</text>`,
    `<text x="${x0 + plotW - 40}" y="${y0 + plotH + 16}">${num(tMax)} s</text>`,
  ];
  s.lines.forEach((line, i) => {
    const max = Math.max(...line.values, 1);
    const pts = line.values.map((v, k) => `${(x0 + (s.t[k]! / tMax) * plotW).toFixed(1)},${(y0 + plotH - (v / max) * plotH).toFixed(1)}`).join(' ');
    out.push(
      `<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="1.5" points="${pts}"/>`,
      `<text x="${x0 + i * 200}" y="${height - 12}" fill="${COLORS[i % COLORS.length]}">${xml(`${line.name} (max ${num(max)} ${line.unit})`.replace(' )', ')'))}</text>`,
    );
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}
