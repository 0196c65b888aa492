// VMM benchmarks (any KVM host, PVM included): machine create, create -> first
// guest instruction and output, create with the Linux vmlinux -> first KVM_RUN,
// test-guest boot -> banner, PIO and MMIO exit round trips, virtio-blk requests
// from the test guest. bench/run.ts calls
// runVmmBench(); `tsx bench/vmm.ts` runs it alone and writes bench/results/vmm.json.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { arch, cpus, release, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { probeHost } from '../lib/host/probe.js';
import { Machine } from '../lib/vm/machine.js';
import { MMIO_LOOP, PIO_LOOP, PVH_BANNER, builtVmlinux, pvhElf32, sleep, testvmImage, writeTemp } from '../test/vmm-guests.js';
import { type BenchRow, formatTable, summarize } from './report.js';

export interface VmmBenchResult {
  rows: BenchRow[];
  json: { bench: 'vmm'; date: string; node: string; host: string; hostKind: string; rows: BenchRow[] };
}

const ms = (ns: bigint) => Number(ns) / 1e6;

/** Resolves with the hrtime at which the first console event reached JS. */
function firstConsole(m: Machine, timeoutMs = 10_000): Promise<bigint> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('no console output')), timeoutMs);
    m.once('console', () => {
      const at = process.hrtime.bigint();
      clearTimeout(t);
      resolve(at);
    });
  });
}

/** Exits per second of a guest spinning on one kind of exit, and the round trip that implies. */
export async function exitLoop(kernel: string, kind: 'pio' | 'mmio', seconds: number): Promise<{ us: number; exits: number }> {
  const m = Machine.create({ kernel, vcpus: 1, memoryMiB: 16 });
  await m.start();
  await sleep(50);
  const a = m.stats();
  const t0 = process.hrtime.bigint();
  await sleep(seconds * 1000);
  const b = m.stats();
  const elapsedUs = Number(process.hrtime.bigint() - t0) / 1000;
  await m.stop();
  const exits = kind === 'pio' ? b.pioExits - a.pioExits : b.mmioExits - a.mmioExits;
  return { us: elapsedUs / Math.max(1, exits), exits };
}

export async function runVmmBench(opts: { iterations?: number } = {}): Promise<VmmBenchResult> {
  const n = opts.iterations ?? 20;
  const probe = probeHost();
  const rows: BenchRow[] = [];
  const fixture = writeTemp('pvh.elf', pvhElf32());

  // Machine.create: KVM VM, irqchip, PIT, 512 MiB slot, kernel load, 2 vCPUs.
  const create: number[] = [];
  const firstRun: number[] = [];
  const firstExit: number[] = [];
  const firstOutput: number[] = [];
  const banner: number[] = [];
  for (let i = 0; i < n + 2; i++) {
    const t0 = process.hrtime.bigint();
    const m = Machine.create({ kernel: fixture, vcpus: 2, memoryMiB: 512 });
    const t1 = process.hrtime.bigint();
    const out = firstConsole(m);
    await m.start();
    // When the output reached JS, not when start() resolved: start() also waits for vCPU 1
    // (parked until a SIPI) to enter KVM_RUN, which says nothing about the guest's output.
    const t2 = await out;
    await m.waitForConsole(PVH_BANNER, 5000);
    const t3 = process.hrtime.bigint();
    if (i >= 2) {
      create.push(ms(t1 - t0));
      firstRun.push(m.stats().createToFirstRunNs / 1e6);
      firstExit.push(m.stats().createToFirstExitNs / 1e6);
      firstOutput.push(ms(t2 - t0));
      banner.push(ms(t3 - t0));
    }
    await m.stop();
  }
  rows.push({ name: 'machine create (512 MiB, 2 vCPUs)', n, unit: 'ms', ...summarize(create) });
  rows.push({ name: 'create -> first KVM_RUN', n, unit: 'ms', ...summarize(firstRun) });
  rows.push({ name: 'create -> first guest exit (first instructions ran)', n, unit: 'ms', ...summarize(firstExit) });
  const fo = summarize(firstOutput);
  rows.push({ name: 'create -> first guest output (fixture)', n, unit: 'ms', ...fo, target: '<= 2 ms', meetsTarget: fo.p50 <= 2 });
  rows.push({ name: 'create -> fixture banner (22 bytes)', n, unit: 'ms', ...summarize(banner) });

  // The same with the Linux kernel `torpor setup` builds (a ~20 MB vmlinux, ~16 MB of PT_LOAD
  // segments read straight into guest RAM). On a PVM host that kernel cannot run, but
  // everything up to its first KVM_RUN can be measured.
  const vmlinux = builtVmlinux();
  if (vmlinux) {
    const linuxRun: number[] = [];
    for (let i = 0; i < n + 2; i++) {
      const m = Machine.create({ kernel: vmlinux, vcpus: 2, memoryMiB: 512, cmdline: 'console=ttyS0' });
      await m.start();
      if (i >= 2) linuxRun.push(m.stats().createToFirstRunNs / 1e6);
      await m.stop();
    }
    rows.push({ name: 'create with the Linux vmlinux -> first KVM_RUN', n, unit: 'ms', ...summarize(linuxRun) });
  } else {
    rows.push({ name: 'create with the Linux vmlinux -> first KVM_RUN', n: 0, unit: 'ms', note: 'no guest kernel built (torpor setup)' });
  }

  const testvm = testvmImage();
  if (testvm) {
    const tv: number[] = [];
    for (let i = 0; i < Math.min(n, 10) + 1; i++) {
      const t0 = process.hrtime.bigint();
      const m = Machine.create({ kernel: testvm, vcpus: 1, memoryMiB: 256 });
      await m.start();
      await m.waitForConsole('torpor-testvm ready\n', 10_000);
      if (i > 0) tv.push(ms(process.hrtime.bigint() - t0));
      await m.stop();
    }
    rows.push({ name: 'testvm: create -> banner', n: tv.length, unit: 'ms', ...summarize(tv) });
  } else {
    rows.push({ name: 'testvm: create -> banner', n: 0, unit: 'ms', note: 'guest/testvm not built' });
  }

  // pause(): every vCPU kicked out of KVM_RUN, pending I/O completed, parked.
  {
    const m = Machine.create({ kernel: writeTemp('pio.elf', pvhElf32(PIO_LOOP)), vcpus: 2, memoryMiB: 64 });
    await m.start();
    await sleep(20);
    const pause: number[] = [];
    const resume: number[] = [];
    for (let i = 0; i < n * 5; i++) {
      const t0 = process.hrtime.bigint();
      await m.pause();
      const t1 = process.hrtime.bigint();
      await m.resume();
      const t2 = process.hrtime.bigint();
      pause.push(Number(t1 - t0) / 1000);
      resume.push(Number(t2 - t1) / 1000);
      await sleep(2);
    }
    await m.stop();
    rows.push({ name: 'pause (2 vCPUs, one in a PIO loop)', n: pause.length, unit: 'us', ...summarize(pause) });
    rows.push({ name: 'resume', n: resume.length, unit: 'us', ...summarize(resume) });
  }

  const pio = await exitLoop(writeTemp('pio.elf', pvhElf32(PIO_LOOP)), 'pio', 1);
  rows.push({ name: 'PIO exit round trip (in al,0x80 loop)', n: pio.exits, unit: 'us', value: pio.us, note: 'includes the loop\'s jmp' });
  const mmio = await exitLoop(writeTemp('mmio.elf', pvhElf32(MMIO_LOOP)), 'mmio', 1);
  rows.push({ name: 'MMIO exit round trip (unmapped read loop)', n: mmio.exits, unit: 'us', value: mmio.us, note: 'includes the loop\'s jmp' });

  if (testvm) {
    const dir = mkdtempSync(join(tmpdir(), 'torpor-bench-blk-'));
    const base = join(dir, 'base.img');
    writeFileSync(base, Buffer.alloc(8 << 20, 0xa5));
    const m = Machine.create({ kernel: testvm, vcpus: 1, memoryMiB: 64, disks: [{ base, overlay: join(dir, 'overlay') }] });
    await m.start();
    await m.waitForConsole(/boot=ok[^\n]*\n/, 10_000);
    const reqs = 200;
    const before = m.consoleTail().toString().split('blk-read=ok').length;
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < reqs; i++) m.consoleWrite(`blk-read ${(i * 8) % 16000} 8\n`);
    // The UART's FIFO holds 4 KiB of input: 200 short lines fit.
    for (;;) {
      const done = m.consoleTail().toString().split('blk-read=ok').length - before;
      if (done >= reqs) break;
      if (Number(process.hrtime.bigint() - t0) > 60e9) break;
      await sleep(2);
    }
    const sec = Number(process.hrtime.bigint() - t0) / 1e9;
    rows.push({
      name: 'virtio-blk 4 KiB reads from testvm (serial-driven)',
      n: reqs,
      unit: 'KiB/s',
      value: (reqs * 4) / sec,
      note: `${((sec * 1e3) / reqs).toFixed(1)} ms per command: mostly the guest's FNV hash of the data and serial I/O, emulated on PVM`,
    });
    await m.stop();
  }

  return {
    rows,
    json: {
      bench: 'vmm',
      date: new Date().toISOString(),
      node: process.version,
      host: `${arch()} ${cpus()[0]?.model ?? ''} linux ${release()}`,
      hostKind: probe.hostKind,
      rows,
    },
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const result = await runVmmBench();
  console.log(formatTable(result.rows));
  const out = join(dirname(fileURLToPath(import.meta.url)), 'results', 'vmm.json');
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, JSON.stringify(result.json, null, 2) + '\n');
  console.log(`wrote ${out}`);
}
