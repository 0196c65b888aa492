// The one way a test says it cannot run on this host. Every skip is counted by
// uvu as skipped, says why where it is registered, is listed again when the
// process exits (so a run's log ends with what did not run), and is appended to
// $TORPOR_SKIP_LOG (one JSON object per line) for CI and the test harnesses,
// which must be able to tell, e.g., that no Linux-guest test was skipped.
import { spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, readFileSync, writeSync } from 'node:fs';

import { test } from 'uvu';

/**
 * Why a test could not run, by kind: `linux-guest` marks a test that boots a
 * Linux guest under our VMM (the suite the nested and hardware hosts exist to
 * run; a harness on such a host asserts there are none of these).
 */
export type SkipCategory = 'linux-guest' | 'kvm' | 'root' | 'tools' | 'artifacts' | 'host';

export interface SkipRecord {
  file: string;
  test: string;
  category: SkipCategory;
  reason: string;
}

type TestFn = () => void | Promise<void>;
export type Registrar = (name: string, fn: TestFn) => void;

const skipped: SkipRecord[] = [];
const announced = new Set<string>();

/**
 * The list a log ends with: the skipped tests in registration order, with category and reason.
 * Tests skipped for one reason are listed under it, the reason said once: on a PVM host 29
 * Linux-guest tests share one reason of some 500 characters, and a CI log's tail is read.
 */
export function formatSkips(records: readonly SkipRecord[]): string {
  if (records.length === 0) return 'skipped tests: none\n';
  const groups = new Map<string, SkipRecord[]>();
  for (const r of records) {
    const key = `${r.category}\0${r.reason}`;
    const group = groups.get(key);
    if (group) group.push(r);
    else groups.set(key, [r]);
  }
  const lines = [`skipped tests: ${records.length}`];
  for (const group of groups.values()) {
    const { category, reason } = group[0]!;
    if (group.length === 1) {
      lines.push(`  [${category}] ${group[0]!.file}: ${group[0]!.test} -- ${reason}`);
      continue;
    }
    lines.push(`  [${category}] ${group.length} tests -- ${reason}`);
    for (const r of group) lines.push(`    ${r.file}: ${r.test}`);
  }
  return lines.join('\n') + '\n';
}

/** The records in a $TORPOR_SKIP_LOG file (a missing log: nothing was skipped, or nothing ran). */
export function readSkipLog(path: string): SkipRecord[] {
  if (!existsSync(path)) return [];
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as SkipRecord);
}

process.on('exit', () => {
  // Synchronous: the event loop is over. Only when something was skipped, so a run
  // where everything ran ends with uvu's own summary.
  if (skipped.length) writeSync(1, '\n' + formatSkips(skipped));
});

function record(entry: SkipRecord): void {
  skipped.push(entry);
  const key = `${entry.file}\0${entry.reason}`;
  if (!announced.has(key)) {
    announced.add(key);
    console.log(`${entry.file}: skipped [${entry.category}], ${entry.reason}`);
  }
  const log = process.env.TORPOR_SKIP_LOG;
  if (log) appendFileSync(log, JSON.stringify(entry) + '\n');
}

/**
 * uvu's `test` where this host can run the tests registered through it (reason
 * null); otherwise a registrar that marks each of them skipped and records why.
 * Call it once per file, or once per condition when only some tests depend on
 * the host (`const rootTest = testUnless('store', needsRoot(), 'root')`).
 */
export function testUnless(file: string, reason: string | null, category: SkipCategory = 'host'): Registrar {
  if (reason === null) return test;
  return (name: string) => {
    record({ file, test: name, category, reason });
    test.skip(name, () => {});
  };
}

/** Why a test that needs root cannot run here, or null. */
export function needsRoot(): string | null {
  return process.getuid?.() === 0 ? null : 'needs root';
}

/** Whether each command answers `--version` (i.e. is installed and runs). */
function missingCommands(commands: string[]): string[] {
  return commands.filter((c) => spawnSync(c, ['--version'], { stdio: 'ignore' }).status !== 0);
}

/** Why a test that needs these commands cannot run here, or null. */
export function needsCommands(...commands: string[]): string | null {
  const missing = missingCommands(commands);
  return missing.length ? `needs ${missing.join(' and ')}` : null;
}

/** Why a test that needs root and these commands cannot run here, or null. */
export function needsRootAnd(...commands: string[]): string | null {
  return needsRoot() ?? needsCommands(...commands);
}

/**
 * Why `torpor setup` cannot build what is missing in the store on this host
 * (missing tools, missing root: setup's own message), or null when it can (or
 * when everything is already stored).
 */
export async function needsSetup(): Promise<string | null> {
  const { setupBlocker } = await import('../lib/setup/artifacts.js');
  const blocker = await setupBlocker();
  return blocker ? `setup cannot complete on this host: ${blocker.code}: ${blocker.message}` : null;
}
