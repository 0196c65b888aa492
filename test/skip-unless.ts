// The one way a test file says it cannot run on this host.
import { spawnSync } from 'node:child_process';

import { test } from 'uvu';

/**
 * uvu's `test` where this host can run a file's tests; otherwise a registrar that
 * marks them skipped, after printing once why (the only tests allowed not to run
 * are those the host cannot run, and they say so).
 */
export function testUnless(file: string, reason: string | null): (name: string, fn: () => void | Promise<void>) => void {
  if (reason === null) return test;
  console.log(`${file}: skipped, ${reason}`);
  return test.skip;
}

/** Why a test that needs root and these commands cannot run here, or null. */
export function needsRootAnd(...commands: string[]): string | null {
  if (process.getuid?.() !== 0) return 'needs root';
  const missing = commands.filter((c) => spawnSync(c, ['--version'], { stdio: 'ignore' }).status !== 0);
  return missing.length ? `needs ${missing.join(' and ')}` : null;
}
