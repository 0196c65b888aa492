// What the nested suite has finished, kept in the runner's run directory, which outlives one
// L1 boot. When L1 wedges (its emulated CPU stops delivering L1's own interrupts; docs/nested.md,
// "The emulated machine's own failures") the runner kills it and boots a fresh L1, and the suite goes on from the file the
// wedge interrupted: that file runs again from its start, the files that finished keep their
// counts. Written at every file boundary, and when the running file first shows a failed test,
// so a wedge costs at most the file it hit and never hides a failure seen before it.
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';

export interface FileResult {
  passed: number;
  total: number;
}

export interface SuiteState {
  /** Files that finished, with uvu's counts, in the order they finished. */
  files: Record<string, FileResult>;
  /** The file running when the state was last written, if any. */
  running?: string;
  /** Whether a test of the running file had already failed (uvu's ✘) when it was written. */
  runningFailed?: boolean;
  /** Files a wedge interrupted after one of their tests had failed: the suite fails, whatever
   *  their rerun says. */
  failedBeforeWedge: string[];
}

export function emptyState(): SuiteState {
  return { files: {}, failedBeforeWedge: [] };
}

/** The state at `path`; a missing file is a suite that has not started. A file that does not parse
 *  is an error: guessing what ran would let a test that never ran count as passed. */
export function readState(path: string): SuiteState {
  if (!existsSync(path)) return emptyState();
  const s = JSON.parse(readFileSync(path, 'utf8')) as SuiteState;
  if (typeof s !== 'object' || s === null || typeof s.files !== 'object' || !Array.isArray(s.failedBeforeWedge)) {
    throw new Error(`${path}: not a nested-suite state`);
  }
  return s;
}

/** Writes through a temporary file and a rename, so a wedge mid-write leaves the previous state. */
export function writeState(path: string, s: SuiteState): void {
  writeFileSync(`${path}.tmp`, JSON.stringify(s, null, 1) + '\n');
  renameSync(`${path}.tmp`, path);
}

/** The state a new L1 boot starts from: the finished files, and the interrupted file among the
 *  failed ones if a test of it had failed before the wedge. */
export function resumeFrom(s: SuiteState): SuiteState {
  const failed = s.running !== undefined && s.runningFailed ? [s.running] : [];
  return { files: { ...s.files }, failedBeforeWedge: [...s.failedBeforeWedge, ...failed] };
}

/**
 * The distinct tests the skip log records (test/skip-unless.ts, one JSON line each), across every
 * boot: a boot that wedged may have registered some already, and the labels are not always file
 * names, so the count is over (label, test). A torn line (a wedge mid-append) counts as a skip:
 * on the nested host any skip fails the suite, and a line that cannot be read cannot prove
 * otherwise.
 */
export function distinctSkips(skipLog: string): number {
  if (!existsSync(skipLog)) return 0;
  const seen = new Set<string>();
  for (const line of readFileSync(skipLog, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    try {
      const r = JSON.parse(line) as { file: string; test: string };
      seen.add(`${r.file}\0${r.test}`);
    } catch {
      seen.add(`torn\0${line}`);
    }
  }
  return seen.size;
}

/** The wedges so far, one per line of the runner's wedge log: the test file each interrupted,
 *  or '' when it struck before or between files. */
export function readWedges(wedgeLog: string): string[] {
  if (!existsSync(wedgeLog)) return [];
  return readFileSync(wedgeLog, 'utf8').split('\n').slice(0, -1);
}
