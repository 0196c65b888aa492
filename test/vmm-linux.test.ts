// A Linux kernel through the VMM: boots on 2 vCPUs (MP table, IOAPIC, 8250
// console, virtio-mmio from the command line) until it looks for its root
// filesystem, panics and reboots through the i8042: the machine stops with
// reason 'reset'. Runs where Linux can boot: TORPOR_KERNEL set (any host), or
// a hardware-virtualization host (the kernel `torpor setup` builds). Elsewhere
// it says why it is skipped.
import { existsSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { probeHost } from '../lib/host/probe.js';
import { Machine } from '../lib/vm/machine.js';
import { kvmSkipReason } from './vmm-guests.js';
import { testUnless } from './skip-unless.js';

async function findKernel(): Promise<{ kernel: string } | { reason: string }> {
  const noKvm = kvmSkipReason();
  if (noKvm) return { reason: noKvm };
  const supplied = process.env.TORPOR_KERNEL;
  if (supplied) return existsSync(supplied) ? { kernel: supplied } : { reason: `TORPOR_KERNEL=${supplied} does not exist` };
  const kind = probeHost().hostKind;
  if (kind !== 'hardware')
    return {
      reason:
        'this is a PVM host: an ordinary Linux kernel runs here only inside KVM\'s instruction emulator; ' +
        'set TORPOR_KERNEL to a kernel built for this host\'s PVM to run this test',
    };
  const { ensureArtifacts } = await import('../lib/setup/artifacts.js');
  return { kernel: (await ensureArtifacts({})).kernel };
}

const found = await findKernel();
const linuxTest = testUnless('vmm-linux', 'reason' in found ? found.reason : null, 'linux-guest');

linuxTest('Linux boots on 2 vCPUs to the root mount, panics and resets: stopped/reset', async () => {
  const kernel = (found as { kernel: string }).kernel;
  const m = Machine.create({
    kernel,
    vcpus: 2,
    memoryMiB: 256,
    rng: true,
    cmdline: 'console=ttyS0 reboot=k panic=1 pci=off nomodule i8042.noaux i8042.nomux i8042.dumbkbd acpi=off root=/dev/nonexistent',
  });
  const exited = new Promise<{ state: string; kind: string }>((resolve) =>
    m.once('exit', (state, r) => resolve({ state, kind: r.kind })),
  );
  const t0 = performance.now();
  await m.start();
  await m.waitForConsole('Linux version', 60_000);
  await m.waitForConsole(/smp: Brought up \d+ nodes?, 2 CPUs/, 120_000);
  // The bound is cleared once the machine ends: an armed 120 s timer would keep Node alive after the run.
  let bound: NodeJS.Timeout | undefined;
  const end = await Promise.race([
    exited,
    new Promise<never>((_, reject) => {
      bound = setTimeout(() => reject(new Error(`no reset: ${m.consoleTail().toString().slice(-800)}`)), 120_000);
    }),
  ]).finally(() => clearTimeout(bound));
  console.log(`  vmm-linux: boot to panic-reset in ${(performance.now() - t0).toFixed(0)} ms`);
  assert.equal(end, { state: 'stopped', kind: 'reset' });
  assert.match(m.exitReason!.consoleTail, /Kernel panic|VFS: Unable to mount root/);
});

test.run();
