// Snapshot benchmarks with the test guest (any KVM host, PVM included):
// capture (captured and durable) with 0, 1024 and 4096 dirty pages on 512 MiB
// and 2 GiB machines, bytes on disk per generation, restore -> running and ->
// the guest's counter advancing, fork x10. bench/run.ts calls
// runSnapshotBench(); `tsx bench/snapshot.ts` runs it alone.
// Beside them, the same test guest under QEMU with KVM (microvm, -cpu qemu64):
// migrate-to-file save (stop -> migration completed) and restore with
// -incoming (process start -> running again), with torpor/QEMU ratios.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import net from 'node:net';
import { mkdir, writeFile } from 'node:fs/promises';
import { arch, release, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { probeHost } from '../lib/host/probe.js';
import { Machine } from '../lib/vm/machine.js';
import { bootTestvm, sleep, testvmCommand, testvmImage } from '../test/vmm-guests.js';
import { type BenchRow, formatTable, summarize } from './report.js';

export interface SnapshotBenchResult {
  rows: BenchRow[];
  json: { bench: 'snapshot'; date: string; node: string; host: string; hostKind: string; rows: BenchRow[] };
}

const COUNTER = 0x100008;
const counter = (m: Machine) => m.readGuest(COUNTER, 8).readBigUInt64LE();

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
      for (let i = 0; i < iterations; i++) {
        if (pages) await testvmCommand(m, `mem-write 0x${(0x51000000 + i).toString(16)} ${pages} 0x1000000`, 'mem-write', 60_000);
        const r = await m.snapshot(dir);
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
        note: `diff of ${dirty} pages, ${(bytes / 1024).toFixed(0)} KiB per generation`,
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
    for (let i = 0; i < iterations; i++) {
      const t0 = performance.now();
      const r = await Machine.restore(dir);
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
      ...(memoryMiB <= 512 ? { target: '<= 3 ms (to first exit)', meetsTarget: tr.p50 <= 3 } : {}),
      note: 'worker thread: state file read + checked, chain opened, VM rebuilt, state loaded',
    });
    rows.push({ name: `restore ${memoryMiB} MiB -> guest counter advancing`, n: iterations, unit: 'ms', ...summarize(toCounting) });
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------- QEMU, for scale

const QEMU = 'qemu-system-x86_64';

function qemuArgs(memoryMiB: number, monitor: string): string[] {
  const virtio = Array.from({ length: 8 }, (_, i) => `virtio_mmio.device=512@0x${(0xfeb00000 + i * 0x200).toString(16)}:${5 + i}`);
  return ['-accel', 'kvm', '-cpu', 'qemu64', '-M', 'microvm,ioapic2=off', '-global', 'virtio-mmio.force-legacy=false',
    '-m', String(memoryMiB), '-display', 'none', '-serial', 'stdio', '-no-reboot', '-nodefaults',
    '-kernel', testvmImage()!, '-append', `${virtio.join(' ')} testvm.count=1`,
    '-monitor', `unix:${monitor},server,nowait`];
}

/** The QEMU human monitor over its Unix socket: one command at a time, answers up to the next prompt. */
class Monitor {
  #sock: net.Socket;
  #buf = '';
  #wake: (() => void) | undefined;
  private constructor(sock: net.Socket) {
    this.#sock = sock;
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => {
      this.#buf += d;
      this.#wake?.();
    });
    sock.on('close', () => {
      this.#closed = true;
      this.#wake?.();
    });
  }
  #closed = false;
  static async open(path: string, timeoutMs = 10_000): Promise<Monitor> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        const sock = await new Promise<net.Socket>((resolve, reject) => {
          const s = net.connect(path, () => resolve(s));
          s.once('error', reject);
        });
        const m = new Monitor(sock);
        await m.#prompt();
        return m;
      } catch (e) {
        if (Date.now() > deadline) throw e;
        await sleep(1);
      }
    }
  }
  async #prompt(): Promise<string> {
    for (;;) {
      const at = this.#buf.indexOf('(qemu) ');
      if (at >= 0) {
        const out = this.#buf.slice(0, at);
        this.#buf = this.#buf.slice(at + 7);
        return out;
      }
      if (this.#closed) throw new Error('QEMU monitor closed');
      await new Promise<void>((r) => (this.#wake = r));
    }
  }
  async cmd(line: string): Promise<string> {
    this.#sock.write(`${line}\n`);
    return this.#prompt();
  }
  /** Ends QEMU (no prompt follows `quit`). */
  quit(): void {
    this.#sock.write('quit\n');
  }
  close(): void {
    this.#sock.destroy();
  }
}

async function qemuRows(memoryMiB: number, iterations: number, rows: BenchRow[], torpor: Map<string, number>): Promise<void> {
  if (spawnSync(QEMU, ['--version'], { stdio: 'ignore' }).status !== 0) {
    rows.push({ name: `QEMU ${memoryMiB} MiB`, n: 0, unit: '', note: `${QEMU} not installed` });
    return;
  }
  const dir = mkdtempSync(join(tmpdir(), 'torpor-bench-qemu-'));
  const save: number[] = [];
  const restore: number[] = [];
  let bytes = 0;
  try {
    for (let i = 0; i < iterations; i++) {
      const file = join(dir, `state-${i}`);
      const mon = join(dir, `mon-${i}`);
      const q = spawn(QEMU, qemuArgs(memoryMiB, mon), { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      q.stdout.on('data', (d: Buffer) => (out += d.toString('latin1')));
      const deadline = Date.now() + 30_000;
      while (!out.includes('boot=ok')) {
        if (Date.now() > deadline) throw new Error(`QEMU did not boot the test guest: ${out.slice(-200)}`);
        await sleep(5);
      }
      const m = await Monitor.open(mon);
      const t0 = performance.now();
      await m.cmd('stop');
      await m.cmd(`migrate "exec:cat > ${file}"`);
      for (;;) {
        const info = await m.cmd('info migrate');
        if (/Migration status: completed/.test(info)) break;
        if (/Migration status: failed/.test(info)) throw new Error(`QEMU migration failed: ${info}`);
        await sleep(1);
      }
      save.push(performance.now() - t0);
      bytes = statSync(file).size;
      const gone = new Promise((r) => q.once('exit', r));
      m.quit();
      await gone;
      m.close();

      const mon2 = join(dir, `mon2-${i}`);
      const t1 = performance.now();
      const r = spawn(QEMU, [...qemuArgs(memoryMiB, mon2), '-incoming', `exec:cat ${file}`], { stdio: 'ignore' });
      const m2 = await Monitor.open(mon2);
      // The source was stopped before its migration, so the destination stays paused once the
      // state is in: continue it, as torpor's restore to 'running' does.
      for (;;) {
        const st = await m2.cmd('info status');
        if (/VM status: running/.test(st)) break;
        if (/VM status: paused/.test(st) && !/inmigrate/.test(st)) await m2.cmd('cont');
        if (performance.now() - t1 > 30_000) throw new Error(`QEMU did not resume: ${st}`);
        await sleep(1);
      }
      restore.push(performance.now() - t1);
      const gone2 = new Promise((res) => r.once('exit', res));
      m2.quit();
      await gone2;
      m2.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const s = summarize(save);
  const r = summarize(restore);
  const ratio = (key: string, q: number) => {
    const t = torpor.get(key);
    return t === undefined ? '' : `; torpor/QEMU = ${(t / q).toFixed(3)}`;
  };
  rows.push({ name: `QEMU ${memoryMiB} MiB: stop + migrate to file`, n: iterations, unit: 'ms', ...s,
    note: `${(bytes / 1024 / 1024).toFixed(1)} MiB file${ratio(`capture-${memoryMiB}`, s.p50)} (torpor: 4096-page diff, durable)` });
  rows.push({ name: `QEMU ${memoryMiB} MiB: -incoming restore, process start -> running`, n: iterations, unit: 'ms', ...r,
    note: `includes QEMU's process start${ratio(`restore-${memoryMiB}`, r.p50)} (torpor: in process, -> running)` });
}

async function forkRows(iterations: number, rows: BenchRow[]): Promise<void> {
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
    await captureRows(512, n, rows, torpor);
    await captureRows(2048, n, rows, torpor);
    await forkRows(Math.max(1, Math.floor(n / 2)), rows);
    await qemuRows(512, 3, rows, torpor);
    await qemuRows(2048, 3, rows, torpor);
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
  const out = join(dirname(fileURLToPath(import.meta.url)), 'results', 'snapshot.json');
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, JSON.stringify(result.json, null, 2) + '\n');
}
