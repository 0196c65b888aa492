// Soak: N test-guest machines in this one process for a duration, each in a
// loop of vsock echo traffic, block writes and verifies, and now and then a
// pause -> capture -> stop -> restore cycle. Samples the process's fds,
// threads, RSS and the snapshot directory's disk usage, prints the curves (a
// table) and writes JSON, then asserts that fds, threads and RSS stayed flat
// (bounded growth after warm-up), and disk too: merges and Machine.pruneSnapshots
// keep each machine's snapshot directory to its last generation's layers. The
// verdict and its limits: bench/soak-judge.ts.
//   node --import tsx bench/soak.ts [--machines 20] [--seconds 300] [--sample 10] [--capture-every 30]
//                                   [--json bench/results/soak.json]
// .ci/run runs the 5-minute version; an hour: --seconds 3600.
// A deliberate leak, to show that the judge fails one (never in CI): TORPOR_SOAK_LEAK_MIB=<n>
// leaves n MiB (decimals allowed) of files in the soak's directory at every capture cycle,
// TORPOR_SOAK_LEAK_FDS=<n> n open fds; neither is ever freed. Both are printed and recorded
// in the JSON, with the host the soak ran on (kind, /dev/kvm, the nested test host or not).
import { type Dirent, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { detectHost } from '../lib/setup/host.js';
import { Machine } from '../lib/vm/machine.js';
import { NESTED } from '../test/bounds.js';
import { sleep, testvmCommandByEvents, testvmImage } from '../test/vmm-guests.js';
import { loadNow, machineRecord } from './machine.js';
import { MERGE_PERIOD_CAPTURES, type SoakSample, judgeSoak } from './soak-judge.js';

const command = (m: Machine, line: string, key: string) => testvmCommandByEvents(m, line, key, 20_000);

/** The soak's settings from its command line (see the usage above). */
function soakArgs(argv: string[]) {
  const { values } = parseArgs({
    args: argv,
    options: {
      machines: { type: 'string', default: '20' },
      seconds: { type: 'string', default: '300' },
      sample: { type: 'string', default: '10' },
      'capture-every': { type: 'string', default: '30' },
      json: { type: 'string', default: 'bench/results/soak.json' },
    },
  });
  return {
    machines: Number(values.machines),
    seconds: Number(values.seconds),
    sampleS: Number(values.sample),
    captureEveryS: Number(values['capture-every']),
    json: values.json!,
  };
}
const MEMORY_MIB = 32;

/** A non-negative number from the environment (0 when unset); anything else stops the soak before it starts. */
function leakSetting(name: string, integer: boolean): number {
  const text = process.env[name];
  if (text === undefined || text === '') return 0;
  const n = Number(text);
  if (!Number.isFinite(n) || n < 0 || (integer && !Number.isInteger(n)))
    throw new Error(`${name}=${text}: want a non-negative ${integer ? 'whole number' : 'number'}`);
  return n;
}
/** The deliberate-leak hook: what every capture cycle leaves behind on purpose, never freed. */
const LEAK = {
  mibPerCapture: leakSetting('TORPOR_SOAK_LEAK_MIB', false),
  fdsPerCapture: leakSetting('TORPOR_SOAK_LEAK_FDS', true),
};
const LEAKING = LEAK.mibPerCapture > 0 || LEAK.fdsPerCapture > 0;
const leakedFds: number[] = [];
let leakedFiles = 0;

/** The hook's share of a capture cycle: files in the machine's directory (outside snap/, which
 *  pruning reads) that count in the soak's disk, and fds of its base image. */
async function leak(dir: string, base: string): Promise<void> {
  if (LEAK.mibPerCapture > 0) {
    await mkdir(join(dir, 'leaked'), { recursive: true });
    // Not zeros: every block is written, so allocated whatever the filesystem does with zeros.
    await writeFile(join(dir, 'leaked', `${leakedFiles++}.bin`), Buffer.alloc(Math.round(LEAK.mibPerCapture * (1 << 20)), 0xa5));
  }
  for (let i = 0; i < LEAK.fdsPerCapture; i++) leakedFds.push(openSync(base, 'r'));
}

const counters = { echoes: 0, blkOps: 0, captures: 0, errors: 0 };
const errors: string[] = [];

function fdCount(): number {
  return readdirSync('/proc/self/fd').length;
}
function status(key: string): number {
  const m = new RegExp(`^${key}:\\s+(\\d+)`, 'm').exec(readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) : NaN;
}
/** Bytes allocated on disk under dir (st_blocks, so sparse files count what they hold). */
function diskBytes(dir: string): number {
  let total = 0;
  let entries: Dirent[];
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (err) {
    // A capture renames its gen-N.tmp directory when it completes and pruning removes old
    // generations: a directory listed a moment ago may be gone. It holds nothing now.
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 0;
    throw err;
  }
  for (const e of entries) {
    const p = join(dir, e.name);
    if (e.isDirectory()) total += diskBytes(p);
    else if (e.isFile()) {
      try {
        total += statSync(p).blocks * 512;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err; // removed meanwhile
      }
    }
  }
  return total;
}

function readExactly(s: net.Socket, n: number, timeoutMs = 10_000): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const timer = setTimeout(() => done(new Error(`vsock echo: ${got}/${n} bytes`)), timeoutMs);
    const onData = (b: Buffer) => {
      chunks.push(b);
      got += b.length;
      if (got >= n) done();
    };
    const onEnd = () => done(new Error(`vsock closed after ${got}/${n} bytes`));
    const done = (err?: Error) => {
      clearTimeout(timer);
      s.off('data', onData);
      s.off('end', onEnd);
      if (err) reject(err);
      else resolve(Buffer.concat(chunks));
    };
    s.on('data', onData);
    s.on('end', onEnd);
  });
}

async function vsockEcho(m: Machine, bytes: number): Promise<void> {
  let s: net.Socket | undefined;
  // After a restore the guest's driver takes a moment to listen again.
  for (let i = 0; i < 50 && !s; i++) {
    try {
      s = await m.vsockConnect(7, 2000);
    } catch {
      await sleep(100);
    }
  }
  if (!s) throw new Error('vsock: no connection to port 7');
  try {
    const payload = Buffer.alloc(bytes, 0x5a);
    s.write(payload);
    const back = await readExactly(s, bytes);
    if (!back.equals(payload)) throw new Error('vsock echo: bytes differ');
    counters.echoes++;
  } finally {
    s.destroy();
  }
}

async function boot(kernel: string, disk: { base: string; overlay: string }): Promise<Machine> {
  const m = Machine.create({ kernel, vcpus: 1, memoryMiB: MEMORY_MIB, vsockCid: 3, disks: [disk] });
  await m.start();
  await m.waitForConsole(/boot=ok[^\n]*\n/, 30_000);
  return m;
}

async function worker(index: number, kernel: string, root: string, deadline: number, captureEveryS: number): Promise<void> {
  const dir = join(root, `m${index}`);
  rmSync(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const base = join(dir, 'base.img');
  writeFileSync(base, Buffer.alloc(1 << 20));
  let m = await boot(kernel, { base, overlay: join(dir, 'overlay.data') });
  let nextCapture = Date.now() + captureEveryS * 1000 * (0.5 + (index % 10) / 10);
  let round = 0;
  try {
    while (Date.now() < deadline) {
      round++;
      try {
        await vsockEcho(m, 16 * 1024);
        const sector = (index * 8 + round) % 2000;
        const tag = `0x${((index << 20) | round).toString(16)}`;
        const w = await command(m, `blk-write ${sector} ${tag} 4`, 'blk-write');
        const v = await command(m, `blk-verify ${sector} ${tag} 4`, 'blk-verify');
        if (!w.startsWith('blk-write=ok') || !v.startsWith('blk-verify=ok')) throw new Error(`blk: ${w} / ${v}`);
        counters.blkOps += 2;
        if (Date.now() >= nextCapture) {
          await m.pause();
          await m.snapshot(join(dir, 'snap'), { stop: true });
          // Older generations' files that this one no longer names (merged away) go.
          await Machine.pruneSnapshots(join(dir, 'snap'));
          m = await Machine.restore(join(dir, 'snap'));
          counters.captures++;
          if (LEAKING) await leak(dir, base);
          // The restored guest still has what was written before the capture.
          const again = await command(m, `blk-verify ${sector} ${tag} 4`, 'blk-verify');
          if (!again.startsWith('blk-verify=ok')) throw new Error(`blk after restore: ${again}`);
          nextCapture = Date.now() + captureEveryS * 1000;
        }
      } catch (err) {
        counters.errors++;
        errors.push(`machine ${index}: ${(err as Error).message}`);
        if (m.state === 'stopped' || m.state === 'failed') throw err;
        await sleep(200);
      }
    }
  } finally {
    await m.stop();
  }
}

/** Runs the soak (`argv`: its command line without node and the script) and writes its JSON. */
export async function main(argv: string[] = []): Promise<void> {
  const opts = soakArgs(argv);
  const load = loadNow();
  const kernel = testvmImage();
  if (!kernel) throw new Error('guest/testvm/out/testvm.elf is not built (make -C guest/testvm)');
  const root = mkdtempSync(join(tmpdir(), 'torpor-soak-'));
  const host = { ...detectHost(), nested: NESTED };
  console.log(
    `soak: host ${host.kind} (from ${host.source}), /dev/kvm ${host.kvm ? 'present' : 'absent'}, ` +
      `${host.nested ? 'inside the nested test host (TORPOR_NESTED=1)' : 'not the nested test host'}`,
  );
  const leakBanner = LEAKING
    ? `*** DELIBERATE LEAK ON: every capture cycle leaves ${LEAK.mibPerCapture} MiB on disk (TORPOR_SOAK_LEAK_MIB) and ` +
      `${LEAK.fdsPerCapture} fds open (TORPOR_SOAK_LEAK_FDS), never freed: the judge must FAIL this run ***`
    : '';
  if (LEAKING) console.log(`soak: ${leakBanner}`);
  const samples: SoakSample[] = [];
  const started = Date.now();
  const deadline = started + opts.seconds * 1000;
  const sample = () => {
    samples.push({
      t: Math.round((Date.now() - started) / 1000),
      fds: fdCount(),
      threads: status('Threads'),
      rssMiB: Math.round(status('VmRSS') / 1024),
      heapMiB: Math.round(process.memoryUsage().heapUsed / (1 << 20)),
      externalMiB: Math.round(process.memoryUsage().external / (1 << 20)),
      diskMiB: Math.round((diskBytes(root) / (1 << 20)) * 10) / 10,
      ...counters,
    });
  };
  sample();
  const timer = setInterval(sample, opts.sampleS * 1000);
  const results = await Promise.allSettled(
    Array.from({ length: opts.machines }, (_, i) => sleep(i * 150).then(() => worker(i, kernel, root, deadline, opts.captureEveryS))),
  );
  clearInterval(timer);
  await sleep(500); // the reaper closes the last VMs' fds
  sample();

  console.log(`soak: ${opts.machines} machines (test guest, ${MEMORY_MIB} MiB, vsock + virtio-blk), ${opts.seconds} s, capture/restore every ${opts.captureEveryS} s per machine`);
  console.log('    t(s)   fds  threads  RSS(MiB)  heap  external  disk(MiB)  echoes  blk ops  captures  errors');
  for (const s of samples)
    console.log(
      `${String(s.t).padStart(8)} ${String(s.fds).padStart(5)} ${String(s.threads).padStart(8)} ${String(s.rssMiB).padStart(9)} ${String(s.heapMiB).padStart(5)} ${String(s.externalMiB).padStart(9)} ${String(s.diskMiB).padStart(10)} ${String(s.echoes).padStart(7)} ${String(s.blkOps).padStart(8)} ${String(s.captures).padStart(9)} ${String(s.errors).padStart(7)}`,
    );

  const verdict = judgeSoak(samples, opts.machines, MERGE_PERIOD_CAPTURES);
  const { period, checks } = verdict;
  const failures: string[] = [];
  for (const r of results) if (r.status === 'rejected') failures.push(`a machine's loop ended: ${(r.reason as Error).message}`);
  if (counters.errors > 0) failures.push(`${counters.errors} errors: ${errors.slice(0, 5).join('; ')}`);
  failures.push(...verdict.failures);
  const last = samples[samples.length - 1]!;
  const diskPerCapture = last.captures ? last.diskMiB / last.captures : 0;
  console.log(
    `flatness (peak and floor, its 10th percentile, of the first merge period after warm-up and of the last, ${period} captures each, limit; a leak raises both): ${Object.entries(checks)
      .map(([k, v]) => `${k} ${v.warm} -> ${v.end} (<= ${v.limit}), floor ${v.warmFloor} -> ${v.endFloor} (<= ${v.floorLimit})`)
      .join(', ')}; ${last.captures} captures, disk at the end ${last.diskMiB} MiB (all of the soak's files)`,
  );
  const out = {
    bench: 'soak',
    date: new Date().toISOString(),
    machines: opts.machines,
    seconds: opts.seconds,
    captureEverySeconds: opts.captureEveryS,
    host,
    machine: machineRecord(load),
    leakHook: { ...LEAK, leakedFiles, leakedFds: leakedFds.length },
    samples,
    // The judge's windows (bench/soak-judge.ts): captures per merge period, at warm-up and at the end.
    judged: { period, warmedAt: verdict.warmedAt, endAt: verdict.endAt, headSamples: verdict.headSamples, tailSamples: verdict.tailSamples },
    checks,
    diskMiBPerCapture: diskPerCapture,
    failures,
  };
  await mkdir(dirname(opts.json), { recursive: true });
  await writeFile(opts.json, JSON.stringify(out, null, 2) + '\n');
  rmSync(root, { recursive: true, force: true });
  if (LEAKING) console.log(`soak: ${leakBanner}`);
  if (failures.length) {
    console.error(`soak: FAILED${LEAKING ? ' (the deliberate leak hook was on)' : ''}\n  ${failures.join('\n  ')}`);
    process.exit(1);
  }
  console.log(LEAKING ? 'soak: flat, ALTHOUGH THE DELIBERATE LEAK HOOK WAS ON: the judge missed the leak' : 'soak: flat');
}

// Runs only when started as a script (`npm run bench` does not import it unless named).
if (process.argv[1] === fileURLToPath(import.meta.url)) await main(process.argv.slice(2));
