// What the sandbox benchmarks that stand guest/testvm in for Linux share: the boot options of
// such a sandbox (an idle test guest whose agent stand-in answers at once; no counter, so many
// of them do not time the scheduler of a small host), or the skipped row where this host lacks
// the test guest or the stored root filesystem.
import { baseIsCached } from '../lib/setup/rootfs.js';
import type { SandboxOpts } from '../lib/sandbox/sandbox.js';
import { homeLayout } from '../lib/store/home.js';
import { testvmImage } from '../test/vmm-guests.js';
import type { BenchRow } from './report.js';

export type TestGuestBoot = NonNullable<SandboxOpts['boot']> & { kernel: string };

/** `{ boot }` for Sandbox.create, or `{ skipped }`: what the bench returns as is (one row, named `row`). */
export async function testGuestSandbox(bench: string, row: string): Promise<{ boot: TestGuestBoot } | { skipped: { rows: BenchRow[]; json: unknown } }> {
  const kernel = testvmImage();
  if (!kernel || !(await baseIsCached(homeLayout().artifacts, false))) {
    const rows: BenchRow[] = [{ name: row, n: 0, unit: 'ms', note: 'skipped: needs guest/testvm built and the root filesystem stored (torpor setup)' }];
    return { skipped: { rows, json: { bench, date: new Date().toISOString(), rows } } };
  }
  return { boot: { kernel, cmdlineExtra: 'testvm.agent_ready=1', timeoutMs: 15_000 } };
}
