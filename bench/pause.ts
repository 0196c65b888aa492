// Sandbox.pause and Sandbox.connect (issue 8) with guest/testvm standing in for Linux, so it runs
// on every KVM host: pause after 16 MiB dirtied (captured / durable), connect in this process ->
// the agent's first answer, connect in a new Node process -> first answer (with and without the
// Node start), bytes on disk of a paused sandbox. The Linux figures of docs/architecture.md#performance-targets need a Linux
// guest on a hardware host (the nested host's emulated timings mean nothing).
import { spawnSync } from 'node:child_process';

import { FieldWriter } from '../lib/agent/fields.js';
import { FrameType } from '../lib/agent/protocol.js';
import type { AgentClient } from '../lib/agent/client.js';
import { Sandbox } from '../lib/sandbox/sandbox.js';
import type { Machine } from '../lib/vm/machine.js';
import { testvmCommand } from '../test/vmm-guests.js';
import { type BenchRow, formatTable, summarize } from './report.js';
import { testGuestSandbox } from './test-guest-sandbox.js';

const internals = (sbx: Sandbox) => sbx as unknown as { client: AgentClient; machine: Machine };
const echo = (sbx: Sandbox) => internals(sbx).client.call(FrameType.ECHO, new FieldWriter().bytes('data', Buffer.from('x')));

export async function runPauseBench(opts: { iterations?: number; memoryMiB?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const n = opts.iterations ?? 10;
  const memoryMiB = opts.memoryMiB ?? 512;
  const guest = await testGuestSandbox('pause', 'Sandbox.pause / connect (test guest)');
  if ('skipped' in guest) return guest.skipped;
  const { boot } = guest;
  const rows: BenchRow[] = [];
  let sbx = await Sandbox.create({ vcpus: 1, memoryMiB, boot });
  const id = sbx.sandboxId;
  const pauseMs: number[] = [];
  const captured: number[] = [];
  const durable: number[] = [];
  const connectMs: number[] = [];
  const firstMs: number[] = [];
  let bytesPaused = 0;
  try {
    // The first pause writes a diff over the template (the full image for a booted sandbox); the measured ones are diffs.
    await sbx.pause();
    sbx = await Sandbox.connect(id);
    for (let i = 0; i < n; i++) {
      // 4096 pages (16 MiB) written by the guest at 16 MiB.
      await testvmCommand(internals(sbx).machine, `mem-write 0x${(0x7e570000 + i).toString(16)} 4096`, 'mem-write');
      const t0 = performance.now();
      const r = await sbx.pause();
      pauseMs.push(performance.now() - t0);
      captured.push(r.capturedMs);
      durable.push(r.durableMs);
      const t1 = performance.now();
      sbx = await Sandbox.connect(id);
      const t2 = performance.now();
      await echo(sbx);
      connectMs.push(t2 - t1);
      firstMs.push(performance.now() - t1);
    }
    await sbx.pause();
    bytesPaused = (await Sandbox.getInfo(id)).bytesOnDisk;
    const child: Array<{ connectMs: number; firstAnswerMs: number; sinceStartMs: number }> = [];
    const wall: number[] = [];
    for (let i = 0; i < Math.min(n, 5); i++) {
      const t0 = performance.now();
      const r = spawnSync(process.execPath, ['--import', 'tsx', 'test/fixtures/pause-bench-child.ts', id], { encoding: 'utf8', timeout: 60_000 });
      wall.push(performance.now() - t0);
      if (r.status !== 0) throw new Error(`child failed: ${r.stderr}`);
      child.push(JSON.parse(r.stdout.trim().split('\n').pop()!));
    }
    rows.push({ name: `pause after 16 MiB dirtied (${memoryMiB} MiB machine): captured`, n, unit: 'ms', ...summarize(captured), target: '<= 10 ms (test guest)' });
    rows.push({ name: '  durable (fdatasync, current switched)', n, unit: 'ms', ...summarize(durable) });
    rows.push({ name: '  sbx.pause() in all (SYNC, capture, meta.json, lock released)', n, unit: 'ms', ...summarize(pauseMs) });
    rows.push({ name: 'Sandbox.connect in this process (restore, rendezvous, RESUMED)', n, unit: 'ms', ...summarize(connectMs) });
    rows.push({ name: '  -> first agent answer', n, unit: 'ms', ...summarize(firstMs) });
    rows.push({ name: 'Sandbox.connect in a new Node process -> first answer (no Node start)', n: child.length, unit: 'ms', ...summarize(child.map((c) => c.firstAnswerMs)), target: '<= 25 ms (Linux)' });
    rows.push({ name: '  same, from the process start (tsx loader included)', n: child.length, unit: 'ms', ...summarize(child.map((c) => c.sinceStartMs)) });
    rows.push({ name: '  same, spawn to exit (a pause included)', n: child.length, unit: 'ms', ...summarize(wall) });
    rows.push({ name: `bytes on disk of the paused sandbox (${n + 2} generations)`, n: 1, unit: 'MiB', value: bytesPaused / 2 ** 20 });
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
  return { rows, json: { bench: 'pause', date: new Date().toISOString(), node: process.version, memoryMiB, rows } };
}

/**
 * Bytes on disk of a paused Linux sandbox after `echo hi > f` (docs/architecture.md#performance-targets: <= 8 MiB beyond its
 * template): the sandbox's directory (memory layer, frozen disk layer, meta.json, console.log);
 * the template (kernel, root filesystem) is shared in the store and not counted. Byte counts are
 * valid in the nested host of `npm run test:linux` (timings there are not).
 */
export async function runLinuxDiskBench(opts: { memoryMiB?: number } = {}): Promise<BenchRow[]> {
  const memoryMiB = opts.memoryMiB ?? 512;
  const sbx = await Sandbox.create({ vcpus: 1, memoryMiB, boot: { timeoutMs: 300_000 } });
  const id = sbx.sandboxId;
  try {
    const r = await sbx.commands.run('echo hi > f && cat f');
    if (r.stdout !== 'hi\n') throw new Error(`echo hi > f: ${JSON.stringify(r)}`);
    await sbx.pause();
    const info = await Sandbox.getInfo(id);
    const parts = spawnSync('du', ['-a', '-B1', '--apparent-size', (sbx as unknown as { dir: string }).dir], { encoding: 'utf8' }).stdout;
    const allocated = spawnSync('du', ['-a', '-B1', (sbx as unknown as { dir: string }).dir], { encoding: 'utf8' }).stdout;
    console.error(`apparent sizes:\n${parts}\nallocated:\n${allocated}`);
    return [
      {
        name: `bytes on disk of a paused Linux sandbox after \`echo hi > f\` (${memoryMiB} MiB, 1 generation, beyond the template)`,
        n: 1,
        unit: 'MiB',
        value: info.bytesOnDisk / 2 ** 20,
        target: '<= 8 MiB',
      },
    ];
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  if (process.argv.includes('--linux-disk')) {
    const rows = await runLinuxDiskBench();
    console.log(formatTable(rows));
    console.log(JSON.stringify({ bench: 'pause-linux-disk', date: new Date().toISOString(), nested: process.env.TORPOR_NESTED === '1', rows }));
  } else {
    const { rows } = await runPauseBench();
    console.log(formatTable(rows));
  }
}
