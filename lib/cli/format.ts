// What the sandbox commands print: aligned columns, ages and sizes a person reads at a glance,
// and durations as people type them (`30m`, `7d`).
import { InvalidArgumentError } from '../errors.js';

export { formatBytes } from '../setup/progress.js';

/** Rows as columns separated by two spaces, each as wide as its widest cell; the last column unpadded. */
export function table(rows: string[][]): string {
  const widths: number[] = [];
  for (const row of rows) row.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length)));
  return rows.map((row) => row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]!))).join('  ')).join('\n') + '\n';
}

/** 90_000 -> "1m": the largest whole unit (s, m, h, d). */
export function formatAge(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/** "90s", "30m", "12h", "7d", "2w", "0" -> milliseconds; anything else is INVALID_ARGUMENT naming `flag`. */
export function parseDuration(flag: string, text: string): number {
  if (text === '0') return 0;
  const m = /^(\d+)(ms|s|m|h|d|w)$/.exec(text);
  if (!m) throw new InvalidArgumentError(`${flag} takes a duration such as 90s, 30m, 12h, 7d or 2w; got ${JSON.stringify(text)}`);
  return Number(m[1]) * UNITS[m[2]!]!;
}
