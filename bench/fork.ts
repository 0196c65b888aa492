// sbx.fork(10), sbx.checkpoint() and sbx.restore() with the test guest (64 MiB, 1 vCPU) standing
// in for Linux, side by side in one run with what they compare to: machine.fork(10) of the same
// guest (the target: fork of 10 within 2x of it), and Sandbox.connect of a paused sandbox for the
// restore. A checkpoint says how long the guest stood still and what it wrote.
// Each sandbox gets a first generation before anything is timed (a checkpoint: a full memory
// layer), as the machine reference does (one snapshot first): every timed capture is a diff.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { Sandbox } from '../lib/sandbox/sandbox.js';
import { bootTestvm } from '../test/vmm-guests.js';
import { homeFilesystem } from './machine.js';
import { type BenchRow, formatTable, summarize } from './report.js';
import { sampleThreadCpu, threadCpuSince } from './thread-cpu.js';
import { testGuestSandbox } from './test-guest-sandbox.js';

const CHILDREN = 10;

export async function runForkBench(opts: { iterations?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const n = opts.iterations ?? 5;
  const guest = await testGuestSandbox('fork', 'sbx.fork (test guest)');
  if ('skipped' in guest) return guest.skipped;
  const { boot } = guest;
  const rows: BenchRow[] = [];
  const machineFork: number[] = [];
  const sandboxFork: number[] = [];
  const sandboxForkNet: number[] = [];
  const checkpoint: number[] = [];
  const stopped: number[] = [];
  const written: number[] = [];
  const restore: number[] = [];
  const connect: number[] = [];
  const machineGuestCpu: number[] = [];
  const machineHostCpu: number[] = [];
  const machineJsCpu: number[] = [];
  const forkGuestCpu: number[] = [];
  const forkHostCpu: number[] = [];
  const forkJsCpu: number[] = [];
  for (let i = 0; i < n + 1; i++) {
    // The reference: the machine level, the same guest and size, a generation first.
    const m = await bootTestvm({ memoryMiB: 64 });
    const dir = mkdtempSync(join(tmpdir(), 'torpor-bench-fork-'));
    await m.snapshot(dir);
    const cpu0 = sampleThreadCpu();
    const t0 = performance.now();
    const kids = await m.fork(CHILDREN);
    const machineMs = performance.now() - t0;
    const machineCpu = threadCpuSince(cpu0);
    await Promise.all([m, ...kids].map((k) => k.stop()));
    rmSync(dir, { recursive: true, force: true });

    for (const network of [false, undefined] as const) {
      const sbx = await Sandbox.create({ template: false, vcpus: 1, memoryMiB: 64, boot, ...(network === false ? { network } : {}) });
      try {
        // A first generation (a full memory layer) before what is timed: every later capture,
        // the checkpoint's and the fork's, writes a diff, as the machine reference does.
        await sbx.checkpoint();
        const c0 = performance.now();
        const cp = await sbx.checkpoint();
        const checkpointMs = performance.now() - c0;
        const fc0 = sampleThreadCpu();
        const f0 = performance.now();
        const children = await sbx.fork(CHILDREN);
        const forkMs = performance.now() - f0;
        const forkCpu = threadCpuSince(fc0);
        await Promise.all(children.map((c) => c.kill()));
        const r0 = performance.now();
        await sbx.restore(cp);
        const restoreMs = performance.now() - r0;
        // The reference for the restore: a connect of a paused sandbox (its latest generation).
        await sbx.pause();
        const k0 = performance.now();
        const again = await Sandbox.connect(sbx.sandboxId);
        const connectMs = performance.now() - k0;
        await again.kill();
        if (i === 0) continue; // the first round warms the restore pool and the page cache
        if (network === false) {
          sandboxFork.push(forkMs);
          checkpoint.push(checkpointMs);
          stopped.push(cp.stoppedMs ?? NaN);
          written.push(cp.bytes / 1024);
          restore.push(restoreMs);
          connect.push(connectMs);
          machineFork.push(machineMs);
          machineGuestCpu.push(machineCpu.guestMs);
          machineHostCpu.push(machineCpu.hostMs);
          machineJsCpu.push(machineCpu.jsMs);
          forkGuestCpu.push(forkCpu.guestMs);
          forkHostCpu.push(forkCpu.hostMs);
          forkJsCpu.push(forkCpu.jsMs);
        } else sandboxForkNet.push(forkMs);
      } finally {
        await Sandbox.kill(sbx.sandboxId).catch(() => false);
      }
    }
  }
  const mf = summarize(machineFork);
  const sf = summarize(sandboxFork);
  const ratio = sf.p50 / mf.p50;
  rows.push({ name: `machine.fork(${CHILDREN}) of a 64 MiB test guest with a generation`, n, unit: 'ms', ...mf, note: 'the reference: diff capture + 10 restores' });
  rows.push({
    name: `sbx.fork(${CHILDREN}), network: false`,
    n,
    unit: 'ms',
    ...sf,
    target: `<= 2x machine.fork (${(2 * mf.p50).toFixed(1)} ms)`,
    meetsTarget: ratio <= 2,
    note: `${ratio.toFixed(2)}x the machine fork: each child also has its directory, lock and fsynced meta.json, its agent's vsock rendezvous, HELLO and RESUMED (answered by the guest) before fork returns; the CPU rows below say how much of it is the guests'`,
  });
  rows.push({ name: `sbx.fork(${CHILDREN}) with a network (a passt per child)`, n, unit: 'ms', ...summarize(sandboxForkNet) });
  // Where the CPU went (bench/thread-cpu.ts): the guests' vCPU threads apart from the host's.
  const guestNote = 'the guests\' vCPU threads: on PVM the test guest runs in KVM\'s instruction emulator';
  rows.push({ name: `machine.fork(${CHILDREN}): CPU of the guests' vCPU threads`, n, unit: 'ms', ...summarize(machineGuestCpu) });
  rows.push({ name: `machine.fork(${CHILDREN}): CPU of every other thread (JS, thread pool, VMM)`, n, unit: 'ms', ...summarize(machineHostCpu) });
  rows.push({
    name: `sbx.fork(${CHILDREN}), network: false: CPU of the guests' vCPU threads`,
    n,
    unit: 'ms',
    ...summarize(forkGuestCpu),
    note: `${guestNote} (the parent's SYNC; per child the transport reset, the connect, HELLO with RESUMED behind it)`,
  });
  const home = homeFilesystem();
  rows.push({
    name: `sbx.fork(${CHILDREN}), network: false: CPU of every other thread (JS, thread pool, VMM)`,
    n,
    unit: 'ms',
    ...summarize(forkHostCpu),
    ...(home?.type === 'ext4' && home.journal === false
      ? { note: `TORPOR_HOME is on ext4 without a journal: each of the ~7 inodes a child creates skips every inode deleted in the last minute (the earlier rounds' sandboxes), a scan a journaled ext4 does not make` }
      : {}),
  });
  // One thread: a floor under the wall time on any host (JS runs at native speed on PVM too).
  const js = summarize(forkJsCpu);
  rows.push({ name: `machine.fork(${CHILDREN}): CPU of the JS thread`, n, unit: 'ms', ...summarize(machineJsCpu) });
  rows.push({
    name: `sbx.fork(${CHILDREN}), network: false: CPU of the JS thread`,
    n,
    unit: 'ms',
    ...js,
    note: `${(js.p50 / mf.p50).toFixed(2)}x the machine fork's wall: a floor under sbx.fork's wall on a hardware host too, where the guests' share is small (each child's directory, restore, agent client and socket, HELLO/RESUMED and meta.json are promise chains on this one thread)`,
  });
  rows.push({ name: 'sbx.checkpoint(): the whole call (sync, diff capture, durable; the sandbox runs on)', n, unit: 'ms', ...summarize(checkpoint) });
  rows.push({ name: 'sbx.checkpoint(): the guest stopped for the capture', n, unit: 'ms', ...summarize(stopped) });
  rows.push({ name: 'sbx.checkpoint(): bytes its generation wrote', n, unit: 'KiB', ...summarize(written) });
  rows.push({ name: 'sbx.restore(checkpoint) of a running sandbox (discard, rewind, restore, RESUMED)', n, unit: 'ms', ...summarize(restore) });
  rows.push({ name: 'reference: Sandbox.connect of the paused sandbox (its latest generation)', n, unit: 'ms', ...summarize(connect) });
  return { rows, json: { bench: 'fork', date: new Date().toISOString(), node: process.version, children: CHILDREN, rows } };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { rows } = await runForkBench();
  console.log(formatTable(rows));
}
