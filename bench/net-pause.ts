// What the network adds to pause and connect (docs/network.md, "Pause and resume"), with
// guest/testvm standing in for Linux so it runs on every KVM host: three sandboxes cycled
// interleaved, one with network: false, one with the default network (passt, no forwarded
// port), one forwarding a port (connect waits until passt has bound it). Pause includes
// stopping passt; connect includes starting a fresh one and attaching it before the guest runs.
import { Sandbox, type SandboxOpts } from '../lib/sandbox/sandbox.js';
import { type BenchRow, formatTable, summarize } from './report.js';
import { testGuestSandbox } from './test-guest-sandbox.js';

export async function runNetPauseBench(opts: { iterations?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const n = opts.iterations ?? 20;
  const guest = await testGuestSandbox('net-pause', 'pause / connect with a network (test guest)');
  if ('skipped' in guest) return guest.skipped;
  const { boot } = guest;
  const rows: BenchRow[] = [];
  const kinds: Array<{ name: string; network: SandboxOpts['network'] }> = [
    { name: 'network: false', network: false },
    { name: 'network (passt, no forwarded port)', network: {} },
    { name: 'network with ports: [8080]', network: { ports: [8080] } },
  ];
  const sbxs: Sandbox[] = [];
  const pause = kinds.map(() => [] as number[]);
  const connect = kinds.map(() => [] as number[]);
  try {
    for (const k of kinds) sbxs.push(await Sandbox.create({ vcpus: 1, memoryMiB: 64, boot, network: k.network }));
    for (let i = 0; i < n + 1; i++) {
      // Interleaved, in an order that turns, so load from elsewhere falls on every kind alike.
      for (let j = 0; j < kinds.length; j++) {
        const k = (i + j) % kinds.length;
        const t0 = performance.now();
        await sbxs[k]!.pause();
        const t1 = performance.now();
        sbxs[k] = await Sandbox.connect(sbxs[k]!.sandboxId);
        const t2 = performance.now();
        if (i === 0) continue; // the first pause writes the full memory image
        pause[k]!.push(t1 - t0);
        connect[k]!.push(t2 - t1);
      }
    }
  } finally {
    for (const s of sbxs) await s.kill().catch(() => undefined);
  }
  kinds.forEach((k, i) => {
    rows.push({ name: `sbx.pause(), ${k.name} (64 MiB)`, n, unit: 'ms', ...summarize(pause[i]!) });
    rows.push({ name: `Sandbox.connect() from memory, ${k.name}`, n, unit: 'ms', ...summarize(connect[i]!) });
  });
  return { rows, json: { bench: 'net-pause', date: new Date().toISOString(), node: process.version, rows } };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { rows } = await runNetPauseBench();
  console.log(formatTable(rows));
}
