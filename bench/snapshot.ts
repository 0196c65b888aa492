// Snapshot benchmarks with the test guest (any KVM host, PVM included):
// capture (captured and durable) with 0, 1024 and 4096 dirty pages on 512 MiB
// and 2 GiB machines, bytes on disk per generation, restore -> running and ->
// the guest's counter advancing, restore -> the guest's first exit (VM shell pool
// off and on), fork x10. bench/run.ts calls
// runSnapshotBench(); `tsx bench/snapshot.ts` runs it alone (TORPOR_BENCH_ONLY=capture,first-exit,fork,qemu
// picks parts).
// Beside them, the same test guest under QEMU with KVM (microvm, -cpu qemu64):
// migrate-to-file save and restore with -incoming (bench/qemu/migrate.ts: process
// start -> the guest answers again), with torpor/QEMU ratios.
import { mkdtempSync, rmSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { arch, release, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { probeHost } from '../lib/host/probe.js';
import { Machine } from '../lib/vm/machine.js';
import { PIO_LOOP, bootTestvm, pvhElf32, sleep, testvmCommand, testvmImage, writeTemp } from '../test/vmm-guests.js';
import { qemuAvailable, qemuSaveRestore, type QemuSnapshotTiming } from './qemu/migrate.js';
import { type BenchRow, formatTable, summarize } from './report.js';

export interface SnapshotBenchResult {
  rows: BenchRow[];
  json: { bench: 'snapshot'; date: string; node: string; host: string; hostKind: string; rows: BenchRow[] };
}

const COUNTER = 0x100008;
const counter = (m: Machine) => m.readGuest(COUNTER, 8).readBigUInt64LE();

/**
 * KVM calls (ioctls, KVM_RUN aside: Machine.kvmCallCount) and guest exits per run of a path,
 * averaged. The call count is process-wide, so it includes VM shells the restore pool builds
 * meanwhile; exits are the machine's own (none for a restore: its guest has not run yet).
 */
class KvmCost {
  calls = 0;
  exits = 0;
  runs = 0;
  async measure<T>(m: Machine | undefined, path: () => Promise<T>): Promise<T> {
    const k0 = Machine.kvmCallCount();
    const e0 = m ? m.stats().exits : 0;
    const out = await path();
    this.calls += Machine.kvmCallCount() - k0;
    if (m) this.exits += m.stats().exits - e0;
    this.runs++;
    return out;
  }
  text(): string {
    const per = (v: number) => (this.runs ? v / this.runs : 0).toFixed(0);
    return `KVM calls ${per(this.calls)}, exits ${per(this.exits)} per run`;
  }
}

async function captureRows(memoryMiB: number, iterations: number, rows: BenchRow[], torpor: Map<string, number>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-bench-snap-'));
  const m = await bootTestvm({ memoryMiB });
  try {
    const full = await m.snapshot(dir);
    rows.push({ name: `capture ${memoryMiB} MiB, full layer: captured`, n: 1, unit: 'ms', value: full.capturedMs, note: `${full.dirtyPages} nonzero pages` });
    rows.push({ name: `capture ${memoryMiB} MiB, full layer: durable`, n: 1, unit: 'ms', value: full.durableMs });
    for (const pages of [0, 1024, 4096]) {
      const captured: number[] = [];
      const durable: number[] = [];
      let bytes = 0;
      let dirty = 0;
      const cost = new KvmCost();
      for (let i = 0; i < iterations; i++) {
        if (pages) await testvmCommand(m, `mem-write 0x${(0x51000000 + i).toString(16)} ${pages} 0x1000000`, 'mem-write', 60_000);
        const r = await cost.measure(m, () => m.snapshot(dir));
        captured.push(r.capturedMs);
        durable.push(r.durableMs);
        bytes = r.bytes;
        dirty = r.dirtyPages;
      }
      const c = summarize(captured);
      const target = pages === 4096 ? (memoryMiB <= 512 ? '<= 10 ms' : '<= 1.3x the 512 MiB figure') : undefined;
      rows.push({
        name: `capture ${memoryMiB} MiB, ${pages} pages written: captured`, n: iterations, unit: 'ms', ...c,
        ...(target ? { target } : {}),
        ...(pages === 4096 && memoryMiB <= 512 ? { meetsTarget: c.p50 <= 10 } : {}),
        note: `diff of ${dirty} pages, ${(bytes / 1024).toFixed(0)} KiB per generation; ${cost.text()}`,
      });
      const d = summarize(durable);
      rows.push({ name: `capture ${memoryMiB} MiB, ${pages} pages written: durable`, n: iterations, unit: 'ms', ...d });
      if (pages === 4096) torpor.set(`capture-${memoryMiB}`, d.p50);
    }
    await m.stop();
    // Restore: Machine.restore -> every vCPU in KVM_RUN; -> the guest's counter moved.
    const toRunning: number[] = [];
    const toCounting: number[] = [];
    {
      const src = await Machine.restore(dir);
      await testvmCommand(src, 'count start', 'count');
      await src.snapshot(dir, { stop: true });
    }
    const restoreCost = new KvmCost();
    for (let i = 0; i < iterations; i++) {
      const t0 = performance.now();
      const r = await restoreCost.measure(undefined, () => Machine.restore(dir));
      const t1 = performance.now();
      const c0 = counter(r);
      while (counter(r) === c0) await new Promise((res) => setImmediate(res));
      const t2 = performance.now();
      toRunning.push(t1 - t0);
      toCounting.push(t2 - t0);
      await r.stop();
    }
    const tr = summarize(toRunning);
    torpor.set(`restore-${memoryMiB}`, tr.p50);
    rows.push({
      name: `restore ${memoryMiB} MiB -> running (vCPUs in KVM_RUN)`, n: iterations, unit: 'ms', ...tr,
      note: `worker thread: state file read + checked, chain opened, VM shell (pooled) + layer mapped, state loaded; ${restoreCost.text()}; the target is on the first-exit row`,
    });
    rows.push({ name: `restore ${memoryMiB} MiB -> guest counter advancing`, n: iterations, unit: 'ms', ...summarize(toCounting) });
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------- restore -> first guest exit

/**
 * Machine.restore call -> the guest's first PIO/MMIO exit after it (stats().firstExitAtNs, on
 * the clock of process.hrtime), with the VM shell pool off and on. Two guests: the test guest
 * counting in polled mode (it reads the UART every 256 counts, so its own loop adds up to its
 * polling period), and a 1-instruction `in al,0x80` loop (exits at once: the restore alone).
 * With the pool on, each restore starts once a shell is ready (restores spaced by at least
 * the shell build time, a few ms; back-to-back restores beyond the depth build their own).
 */
export async function firstExitRows(memoryMiB: number, iterations: number, rows: BenchRow[], torpor: Map<string, number>): Promise<void> {
  const before = Machine.restorePool();
  const guests: Array<{ name: string; boot: () => Promise<Machine> }> = [
    {
      name: 'test guest (polled counting)',
      boot: async () => {
        const m = await bootTestvm({ memoryMiB, cmdline: 'testvm.poll' });
        await testvmCommand(m, 'count start', 'count');
        return m;
      },
    },
    {
      name: 'PIO-loop guest',
      boot: async () => {
        const m = Machine.create({ kernel: writeTemp('pio-loop.elf', pvhElf32(PIO_LOOP)), vcpus: 1, memoryMiB });
        await m.start();
        await sleep(20);
        return m;
      },
    },
  ];
  try {
    for (const g of guests) {
      const dir = mkdtempSync(join(tmpdir(), 'torpor-bench-first-exit-'));
      try {
        const m = await g.boot();
        await m.snapshot(dir, { stop: true });
        for (const depth of [0, Math.max(before.depth, 2)]) {
          Machine.restorePool({ depth });
          const times: number[] = [];
          const shell: number[] = [];
          const calls: Record<string, number[]> = {};
          for (let i = 0; i < iterations; i++) {
            if (depth) {
              // The first restore of this size asks the pool for shells; wait for one.
              const deadline = Date.now() + 5000;
              while (i > 0 && Machine.restorePool().idle === 0 && Date.now() < deadline) await sleep(1);
            }
            const t0 = process.hrtime.bigint();
            const r = await Machine.restore(dir);
            let s = r.stats();
            const deadline = Date.now() + 5000;
            while (s.firstExitAtNs === 0n && Date.now() < deadline) {
              await new Promise((res) => setImmediate(res));
              s = r.stats();
            }
            if (i > 0 || !depth) {
              times.push(Number(s.firstExitAtNs - t0) / 1e6);
              const ph = s.buildPhasesMs;
              shell.push(Object.entries(ph).reduce((a, [k, v]) => (k.startsWith('shell: ') || k === 'VM shell from the pool' ? a + v : a), 0));
              for (const k of Object.keys(ph)) if (k.startsWith('shell: ')) (calls[k] ??= []).push(ph[k]!);
            }
            await r.stop();
          }
          const t = summarize(times);
          const sh = summarize(shell);
          const pool = depth ? `pool depth ${depth}` : 'pool off';
          if (depth && g.name.startsWith('test guest')) torpor.set(`restore-first-exit-${memoryMiB}`, t.p50);
          rows.push({
            name: `restore ${memoryMiB} MiB -> first guest exit, ${g.name}, ${pool}`, n: times.length, unit: 'ms', ...t,
            ...(memoryMiB <= 512 && depth ? { target: '<= 3 ms', meetsTarget: t.p50 <= 3 } : {}),
            note: `VM shell (built or taken) p50 ${sh.p50.toFixed(2)} ms` +
              Object.entries(calls).map(([k, v]) => `; ${k.slice(7)} ${summarize(v).p50.toFixed(2)}`).join(''),
          });
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    }
  } finally {
    Machine.restorePool({ depth: before.depth });
  }
}

// ---------------------------------------------------------------- QEMU, for scale

/** The same guest, the same 4096 pages written, saved and restored by QEMU (bench/qemu/migrate.ts). */
async function qemuRows(memoryMiB: number, iterations: number, rows: BenchRow[], torpor: Map<string, number>): Promise<void> {
  const missing = qemuAvailable();
  if (missing) {
    rows.push({ name: `QEMU ${memoryMiB} MiB`, n: 0, unit: '', note: missing });
    return;
  }
  const kernel = testvmImage()!;
  const runs: QemuSnapshotTiming[] = [];
  for (let i = 0; i < iterations; i++) runs.push(await qemuSaveRestore(kernel, memoryMiB, 4096));
  const s = summarize(runs.map((r) => r.saveMs));
  const r = summarize(runs.map((x) => x.restoreMs));
  const bytes = runs[runs.length - 1]!.fileBytes;
  const ratio = (key: string, q: number) => {
    const t = torpor.get(key);
    return t === undefined ? '' : `; torpor/QEMU = ${(t / q).toFixed(3)}`;
  };
  rows.push({ name: `QEMU ${memoryMiB} MiB: migrate to file, 4096 pages written`, n: iterations, unit: 'ms', ...s,
    note: `${(bytes / 1024 / 1024).toFixed(1)} MiB file, page cache${ratio(`capture-${memoryMiB}`, s.p50)} (torpor: 4096-page diff, durable)` });
  rows.push({ name: `QEMU ${memoryMiB} MiB: -incoming restore, process start -> guest answers`, n: iterations, unit: 'ms', ...r,
    note: `includes QEMU's process start${ratio(`restore-${memoryMiB}`, r.p50)} (torpor: in process, -> running)` });
}

export async function forkRows(iterations: number, rows: BenchRow[]): Promise<void> {
  const times: number[] = [];
  for (let i = 0; i < iterations; i++) {
    const m = await bootTestvm({ memoryMiB: 512 });
    const dir = mkdtempSync(join(tmpdir(), 'torpor-bench-fork-'));
    const t0 = performance.now();
    const kids = await m.fork(10, dir);
    times.push(performance.now() - t0);
    await Promise.all([m, ...kids].map((k) => k.stop()));
    rmSync(dir, { recursive: true, force: true });
  }
  const f = summarize(times);
  rows.push({ name: 'fork x10 of a running 512 MiB machine', n: iterations, unit: 'ms', ...f, target: '<= 30 ms', meetsTarget: f.p50 <= 30, note: 'full capture into a fresh directory (fsynced) + 10 restores' });
  // A machine that already has a generation: fork() writes only a diff into its directory.
  const again: number[] = [];
  for (let i = 0; i < iterations; i++) {
    const m = await bootTestvm({ memoryMiB: 512 });
    const dir = mkdtempSync(join(tmpdir(), 'torpor-bench-fork-'));
    await m.snapshot(dir);
    const t0 = performance.now();
    const kids = await m.fork(10);
    again.push(performance.now() - t0);
    await Promise.all([m, ...kids].map((k) => k.stop()));
    rmSync(dir, { recursive: true, force: true });
  }
  const g = summarize(again);
  rows.push({ name: 'fork x10 of a 512 MiB machine with a generation', n: iterations, unit: 'ms', ...g, target: '<= 30 ms', meetsTarget: g.p50 <= 30, note: 'diff capture + 10 restores (each rebuilds a VM)' });
}

export async function runSnapshotBench(opts: { iterations?: number } = {}): Promise<SnapshotBenchResult> {
  const n = opts.iterations ?? 5;
  const probe = probeHost();
  const rows: BenchRow[] = [];
  if (!testvmImage()) {
    rows.push({ name: 'snapshot', n: 0, unit: '', note: 'guest/testvm not built' });
  } else {
    const torpor = new Map<string, number>();
    // TORPOR_BENCH_ONLY=first-exit,fork (say) runs only those parts.
    const only = process.env.TORPOR_BENCH_ONLY?.split(',');
    const part = (name: string) => !only || only.includes(name);
    if (part('capture')) {
      await captureRows(512, n, rows, torpor);
      await captureRows(2048, n, rows, torpor);
    }
    if (part('first-exit')) await firstExitRows(512, Math.max(n, 11), rows, torpor);
    if (part('fork')) await forkRows(Math.max(1, Math.floor(n / 2)), rows);
    if (part('qemu')) {
      await qemuRows(512, 3, rows, torpor);
      await qemuRows(2048, 3, rows, torpor);
    }
  }
  await sleep(0);
  return {
    rows,
    json: {
      bench: 'snapshot',
      date: new Date().toISOString(),
      node: process.version,
      host: `${arch()} ${release()}`,
      hostKind: probe.hostKind,
      rows,
    },
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const result = await runSnapshotBench();
  console.log(formatTable(result.rows));
  if (!process.env.TORPOR_BENCH_ONLY) {  // a partial run leaves the full results as they were
    const out = join(dirname(fileURLToPath(import.meta.url)), 'results', 'snapshot.json');
    await mkdir(dirname(out), { recursive: true });
    await writeFile(out, JSON.stringify(result.json, null, 2) + '\n');
  }
}
