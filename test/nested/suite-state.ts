// What the nested suite has finished, kept in the runner's run directory, which outlives one
// L1 boot. When L1 wedges (its emulated CPU stops delivering L1's own interrupts; docs/nested.md,
// "L1 wedges") the runner kills it and boots a fresh L1, and the suite goes on from the file the
// wedge interrupted: that file runs again from its start, the files that finished keep their
// counts. Written at every file boundary, so a wedge at any moment costs at most the file it hit.
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';

import { readSkipLog } from '../skip-unless.js';

export interface FileResult {
  passed: number;
  total: number;
  /** Its tests that skipped (test/skip-unless.ts records naming the file). */
  skipped: number;
}

export interface SuiteState {
  /** Files that finished, with uvu's counts, in the order they finished. */
  files: Record<string, FileResult>;
  /** The file running when the state was last written, if any. */
  running?: string;
  /** Where each wedge so far struck: the file it interrupted, or '' between files. */
  wedges: string[];
}

export function emptyState(): SuiteState {
  return { files: {}, wedges: [] };
}

/** The state at `path`; a missing file is a suite that has not started. A file that does not parse
 *  is an error: guessing what ran would let a test that never ran count as passed. */
export function readState(path: string): SuiteState {
  if (!existsSync(path)) return emptyState();
  const s = JSON.parse(readFileSync(path, 'utf8')) as SuiteState;
  if (typeof s !== 'object' || s === null || typeof s.files !== 'object' || !Array.isArray(s.wedges)) {
    throw new Error(`${path}: not a nested-suite state`);
  }
  return s;
}

/** Writes through a temporary file and a rename, so a wedge mid-write leaves the previous state. */
export function writeState(path: string, s: SuiteState): void {
  writeFileSync(`${path}.tmp`, JSON.stringify(s, null, 1) + '\n');
  renameSync(`${path}.tmp`, path);
}

/**
 * The state a new L1 boot starts from: if an earlier boot was interrupted (it left files or a
 * running file behind), that was a wedge, recorded where it struck.
 */
export function resumeFrom(s: SuiteState): SuiteState {
  const interrupted = s.running !== undefined || Object.keys(s.files).length > 0;
  return {
    files: { ...s.files },
    wedges: interrupted ? [...s.wedges, s.running ?? ''] : [...s.wedges],
  };
}

/** Tests of `file` the skip log records (test/skip-unless.ts), each counted once though an
 *  interrupted boot may have registered them before. */
export function skipsOf(skipLog: string, file: string): number {
  return new Set(readSkipLog(skipLog).filter((r) => r.file === file).map((r) => r.test)).size;
}
