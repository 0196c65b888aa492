// Shared helpers of the benchmarks: timing statistics and a plain-text table.
export interface BenchRow {
  name: string;
  n: number;
  unit: string;
  p50?: number;
  p99?: number;
  mean?: number;
  value?: number;
  target?: string;
  meetsTarget?: boolean;
  note?: string;
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

export function summarize(samples: number[]): { p50: number; p99: number; mean: number } {
  const s = [...samples].sort((a, b) => a - b);
  return { p50: percentile(s, 50), p99: percentile(s, 99), mean: s.reduce((a, b) => a + b, 0) / (s.length || 1) };
}

const fmt = (v: number | undefined) => (v === undefined || Number.isNaN(v) ? '' : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));

/** Formats rows of any bench (fields of BenchRow, missing ones left blank). */
export function formatTable(rows: Array<Partial<BenchRow> & { name: string }>): string {
  const header = ['bench', 'n', 'unit', 'p50', 'p99', 'mean', 'value', 'target', 'ok', 'note'];
  const body = rows.map((r) => [
    r.name,
    String(r.n ?? ''),
    r.unit ?? '',
    fmt(r.p50),
    fmt(r.p99),
    fmt(r.mean),
    fmt(r.value),
    r.target ?? '',
    r.meetsTarget === undefined ? '' : r.meetsTarget ? 'yes' : 'NO',
    r.note ?? '',
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 || i >= 7 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ').trimEnd();
  return [line(header), line(widths.map((w) => '-'.repeat(w))), ...body.map(line)].join('\n');
}
