// The network backend, measured on this machine (issue 9): passt per sandbox (start to first
// answer, resident and proportional memory), libslirp in-process for comparison
// (bench/net/slirp_probe.c, when libslirp-dev is installed), and the device + stream-backend
// path torpor owns (native/bench/net_bench.cc). Guest TCP throughput needs a Linux guest on a
// hardware host: inside the emulated nested host it means nothing.
//   npx tsx bench/run.ts net
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { Passt } from '../lib/net/passt.js';
import { arpRequest, framed, nextFrame, socketPair } from '../test/net-frames.js';
import { type BenchRow, summarize } from './report.js';

async function smapsKiB(pid: number): Promise<{ rss: number; pss: number; private: number }> {
  const text = await readFile(`/proc/${pid}/smaps_rollup`, 'utf8');
  const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? NaN);
  return { rss: field('Rss'), pss: field('Pss'), private: field('Private_Clean') + field('Private_Dirty') };
}

export async function runNetBench(opts: { instances?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const n = opts.instances ?? 8;
  const rows: BenchRow[] = [];
  const starts: number[] = [];
  const arps: number[] = [];
  const mem: Array<{ rss: number; pss: number; private: number }> = [];
  const running: Array<{ passt: Passt; close: () => void }> = [];
  try {
    for (let i = 0; i < n; i++) {
      const [ours, theirs] = await socketPair();
      const t0 = performance.now();
      const passt = await Passt.start({ fd: theirs, network: { egress: true, allowHostLoopback: false, ports: [] } });
      ours.write(framed(arpRequest()));
      await nextFrame(ours, (f) => f.readUInt16BE(12) === 0x0806 && f.readUInt16BE(20) === 2);
      starts.push(performance.now() - t0);
      const t1 = performance.now();
      ours.write(framed(arpRequest()));
      await nextFrame(ours, (f) => f.readUInt16BE(12) === 0x0806 && f.readUInt16BE(20) === 2);
      arps.push((performance.now() - t1) * 1000);
      running.push({ passt, close: () => ours.destroy() });
    }
    // All n alive at once: what n sandboxes cost.
    for (const { passt } of running) mem.push(await smapsKiB(passt.pid!));
  } finally {
    for (const r of running) {
      r.close();
      await r.passt.stop();
    }
  }
  const s = summarize(starts);
  rows.push({ name: 'passt: spawn -> first ARP answer', n, unit: 'ms', ...s, target: '< 5 ms added to start (runs beside the machine build)', note: 'spawned while Machine.build runs' });
  rows.push({ name: 'passt: ARP round trip over the stream socket', n, unit: 'us', ...summarize(arps) });
  const rss = summarize(mem.map((m) => m.rss / 1024));
  const pss = summarize(mem.map((m) => m.pss / 1024));
  const priv = summarize(mem.map((m) => m.private / 1024));
  rows.push({ name: 'passt: RSS per sandbox', n, unit: 'MiB', ...rss, target: '< 5 MiB', meetsTarget: rss.p50 < 5 });
  rows.push({ name: 'passt: PSS per sandbox (shared pages split)', n, unit: 'MiB', ...pss });
  rows.push({ name: 'passt: private memory per sandbox', n, unit: 'MiB', ...priv, target: '< 5 MiB', meetsTarget: priv.p50 < 5 });

  let slirp: unknown;
  const probe = join(tmpdir(), `torpor-slirp-probe-${process.pid}`);
  if (existsSync('/usr/include/slirp/libslirp.h')) {
    const built = spawnSync('cc', ['-O2', 'bench/net/slirp_probe.c', '-lslirp', '-o', probe], { encoding: 'utf8' });
    if (built.status === 0) {
      slirp = JSON.parse(execFileSync(probe, { encoding: 'utf8' }));
      const r = slirp as { instances: number; create_us_each: number; arp_us_each: number; rss_kib_each: number };
      rows.push({ name: 'libslirp (in-process): create', n: r.instances, unit: 'us', value: r.create_us_each });
      rows.push({ name: 'libslirp (in-process): ARP answered', n: r.instances, unit: 'us', value: r.arp_us_each });
      rows.push({ name: "libslirp (in-process): RSS added to the host process", n: r.instances, unit: 'KiB', value: r.rss_kib_each, note: "the user's Node process parses guest packets" });
    }
  }

  let device: string | undefined;
  const make = spawnSync('make', ['-s', '-C', 'native/bench', 'net'], { encoding: 'utf8' });
  if (make.status === 0) {
    device = make.stdout;
    for (const m of make.stdout.matchAll(/frame\s+(\d+) B: guest->backend\s+([\d.]+) Gbit\/s\s+backend->guest\s+([\d.]+) Gbit\/s/g)) {
      rows.push({ name: `device + stream backend, ${m[1]} B frames: guest -> backend`, n: 1, unit: 'Gbit/s', value: Number(m[2]), target: '>= 2 Gbit/s (whole path, hardware host)' });
      rows.push({ name: `device + stream backend, ${m[1]} B frames: backend -> guest`, n: 1, unit: 'Gbit/s', value: Number(m[3]) });
    }
  }
  return { rows, json: { instances: n, startsMs: starts, arpUs: arps, passtMemoryKiB: mem, slirp, device } };
}
