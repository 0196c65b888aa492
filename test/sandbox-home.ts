// The frame of the test-guest Sandbox tests (sandbox-testvm, sandbox-pause, sandbox-net-pause):
// the registrar that skips without a test guest or without the root filesystem in the store,
// and a private TORPOR_HOME per test file whose artifacts/ is the real store, so sandboxes the
// tests make (and leave behind) never land in the user's home.
import { existsSync, mkdtempSync } from 'node:fs';
import { rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { test as uvuTest } from 'uvu';

import type { Sandbox } from '../lib/sandbox/sandbox.js';
import { baseIsCached } from '../lib/setup/rootfs.js';
import { homeLayout } from '../lib/store/home.js';
import type { Machine } from '../lib/vm/machine.js';
import { testUnless, type Registrar } from './skip-unless.js';
import { testvmSkipReason } from './vmm-guests.js';

/** The artifact store of the environment's TORPOR_HOME (kernel, root filesystem). */
export const realStore = homeLayout().artifacts;

/**
 * The file's registrar: skipped ('kvm') when `noVm` says why no test guest runs here, else
 * ('artifacts') when the root filesystem is not in the store.
 */
export async function testvmSandboxTest(file: string, noVm: string | null = testvmSkipReason()): Promise<Registrar> {
  if (noVm) return testUnless(file, noVm, 'kvm');
  const cached = await baseIsCached(realStore, false);
  return testUnless(
    file,
    cached ? null : `the root filesystem is not in the store (${realStore}); run \`torpor setup\` (as .ci/run does) to build it`,
    'artifacts',
  );
}

/**
 * A fresh TORPOR_HOME (named `prefix`...) that is the environment's for the file's tests: set in
 * `test.before`, the previous value back and the directory removed in `test.after`. Returns its path.
 */
export function privateHome(test: typeof uvuTest, prefix: string): string {
  const home = mkdtempSync(join(tmpdir(), prefix));
  let saved: string | undefined;
  test.before(async () => {
    saved = process.env.TORPOR_HOME;
    if (existsSync(realStore)) await symlink(realStore, join(home, 'artifacts'));
    process.env.TORPOR_HOME = home;
  });
  test.after(async () => {
    if (saved === undefined) delete process.env.TORPOR_HOME;
    else process.env.TORPOR_HOME = saved;
    await rm(home, { recursive: true, force: true });
  });
  return home;
}

/** Where the test guest keeps its status page (guest/testvm). */
export const TESTVM_STATUS = 0x100000;

/** The test guest's status page as a sandbox's machine holds it: its counter, the RESUMEDs and
 *  SYNCs its agent answered, the last RESUMED's host time and the entropy it was given. */
export function testvmStatus(sbx: Sandbox) {
  const page = (sbx as unknown as { machine: Machine }).machine.readGuest(TESTVM_STATUS, 0x40);
  return {
    counter: Number(page.readBigUInt64LE(0x08)),
    resumed: page.readUInt32LE(0x24),
    resumedTimeNs: page.readBigUInt64LE(0x28),
    syncs: page.readUInt32LE(0x30),
    entropyLen: page.readUInt32LE(0x34),
    entropyHead: page.readBigUInt64LE(0x38),
  };
}
