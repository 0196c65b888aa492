// Boots our guest kernel under torpor (no root disk: it panics at the root
// mount and resets) and prints its whole console, for looking at what the
// guest sees of the CPU on the nested host (CPUID, xstate, timers):
//   npm run test:linux -- node --import tsx test/nested/boot-console.ts [VCPUS]
import { ensureArtifacts } from '../../lib/setup/artifacts.js';
import { Machine } from '../../lib/vm/machine.js';

const vcpus = Number(process.argv[2] ?? 2);
const { kernel } = await ensureArtifacts({});
const m = Machine.create({
  kernel,
  vcpus,
  memoryMiB: 256,
  cmdline: 'console=ttyS0 reboot=k panic=1 pci=off nomodule i8042.noaux i8042.nomux i8042.dumbkbd acpi=off root=/dev/nonexistent',
});
const exited = new Promise<void>((resolve) => m.once('exit', () => resolve()));
await m.start();
await Promise.race([exited, new Promise((r) => setTimeout(r, 120_000))]);
process.stdout.write(m.consoleTail().toString('utf8'));
console.log(`\nboot-console: state ${m.state}, exit ${JSON.stringify(m.exitReason?.kind)}`);
await m.stop().catch(() => undefined);
