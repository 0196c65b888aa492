// Sandbox.create -> agent HELLO through the real VM path (store artifacts, per-sandbox
// directory and overlay, Machine with the root filesystem and vsock, the agent's knock on vsock port 1023, vsock
// port 1024), with guest/testvm standing in for the Linux guest so it runs on every KVM host.
// Booted (template: false); creates from a warm template are bench/template.ts's. The Linux
// figure (docs/architecture.md#performance-targets: create from template -> first output <= 10 ms) needs a Linux guest.
import { Sandbox } from '../lib/sandbox/sandbox.js';
import { type BenchRow, formatTable, summarize } from './report.js';
import { testGuestSandbox } from './test-guest-sandbox.js';

export async function runSandboxBench(opts: { iterations?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const n = opts.iterations ?? 10;
  const guest = await testGuestSandbox('sandbox', 'Sandbox.create (test guest)');
  if ('skipped' in guest) return guest.skipped;
  const { boot } = guest;
  const rows: BenchRow[] = [];
  const create: number[] = [];
  const kill: number[] = [];
  const createNoNet: number[] = [];
  for (let i = 0; i < n + 1; i++) {
    // Interleaved: the default (a network: passt started beside the build) and network: false.
    for (const network of [undefined, false] as const) {
      const t0 = performance.now();
      // Booted (template: false): this row is the boot path; bench/template.ts measures creates from a template.
      const sbx = await Sandbox.create({ template: false, vcpus: 1, memoryMiB: 64, boot, ...(network === false ? { network } : {}) });
      const t1 = performance.now();
      await sbx.kill();
      const t2 = performance.now();
      if (i === 0) continue; // the first one also validates and stores the kernel
      (network === false ? createNoNet : create).push(t1 - t0);
      if (network === undefined) kill.push(t2 - t1);
    }
  }
  rows.push({
    name: 'Sandbox.create -> HELLO (test guest as the guest, 64 MiB)',
    n,
    unit: 'ms',
    ...summarize(create),
    note: 'includes the guest booting in the emulator on PVM',
  });
  rows.push({ name: 'the same with network: false (no virtio-net, no passt)', n, unit: 'ms', ...summarize(createNoNet), target: 'network adds < 5 ms' });
  rows.push({ name: 'sbx.kill() (machine stopped, passt ended, directory removed)', n, unit: 'ms', ...summarize(kill) });
  return { rows, json: { bench: 'sandbox', date: new Date().toISOString(), node: process.version, rows } };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { rows } = await runSandboxBench();
  console.log(formatTable(rows));
}
