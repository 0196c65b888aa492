// Agent protocol benchmarks over the host transport (the real agent on a Unix socket):
// PING round trip, commands.run of an argv (no shell) and of a shell string, file throughput;
// and PING over virtio-vsock to the test guest's responder through a real VM.
// bench/run.ts calls runAgentBench(); `tsx bench/agent.ts` runs it alone, prints a table and
// writes bench/results/agent.json.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { FieldWriter } from '../lib/agent/fields.js';
import { FrameType } from '../lib/agent/protocol.js';
import { hostAgentBinary, plainAgentEnv, startHostAgent } from '../lib/agent/host.js';
import { AgentClient } from '../lib/agent/client.js';
import { createAgentApi } from '../lib/sandbox/agent-api.js';
import { Machine } from '../lib/vm/machine.js';
import { testvmImage } from '../test/vmm-guests.js';
import { type BenchRow, formatTable, summarize } from './report.js';

export interface AgentBenchRow extends BenchRow {
  transport: 'host-unix' | 'vsock-testvm';
}

export interface AgentBenchResult {
  rows: AgentBenchRow[];
  json: { bench: 'agent'; date: string; node: string; host: string; rows: AgentBenchRow[] };
}

const round = (x: number) => Math.round(x * 10) / 10;

/** Runs fn n times after a warm-up; p50/p99/mean in microseconds. */
async function timed(n: number, warmup: number, fn: () => Promise<unknown>): Promise<{ p50: number; p99: number; mean: number }> {
  // Warm up as long as we measure: the first thousand round trips here run at several times
  // the steady-state latency (JIT, and two processes waking each other on an idle host).
  for (let i = 0; i < warmup; i++) await fn();
  const us: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    await fn();
    us.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  const s = summarize(us);
  return { p50: round(s.p50), p99: round(s.p99), mean: round(s.mean) };
}

/** PING over virtio-vsock to the test guest's protocol responder (every KVM host, this one included). */
async function vsockPingRows(n: number): Promise<AgentBenchRow[]> {
  const image = testvmImage();
  if (!image) return [];
  const m = Machine.create({ kernel: image, vcpus: 1, memoryMiB: 64, vsockCid: 3 });
  try {
    await m.start();
    await m.waitForConsole(/boot=ok[^\n]*\n/, 10_000);
    const client = await AgentClient.connect(() => m.vsockConnect(1024, 2000));
    try {
      const ping = await timed(n, 20, () => client.ping());
      return [{ name: 'agent PING round trip (test guest, emulated on PVM)', transport: 'vsock-testvm', n, unit: 'us', ...ping }];
    } finally {
      await client.close();
    }
  } finally {
    await m.stop();
  }
}

export async function runAgentBench(opts: { iterations?: number; fileMiB?: number } = {}): Promise<AgentBenchResult> {
  const n = opts.iterations ?? 1000;
  const fileMiB = opts.fileMiB ?? 64;
  if (!existsSync(hostAgentBinary())) execFileSync('make', ['-s', '-C', 'guest/agent'], { stdio: 'inherit' });
  const agent = await startHostAgent({ env: plainAgentEnv() });
  const client = await agent.client();
  const api = createAgentApi(client);
  const dir = await mkdtemp(join(tmpdir(), 'torpor-bench-'));
  const rows: AgentBenchRow[] = [];
  try {
    const ping = await timed(n, n, () => client.ping());
    rows.push({ name: 'agent PING round trip', transport: 'host-unix', n, unit: 'us', ...ping, target: 'p50 <= 100 us', meetsTarget: ping.p50 <= 100 });
    const echoFields = new FieldWriter().bytes('data', Buffer.alloc(64));
    const echo = await timed(n, n, () => client.call(FrameType.ECHO, echoFields));
    rows.push({ name: 'ECHO request, 64 B (one stream: request id, answer)', transport: 'host-unix', n, unit: 'us', ...echo });
    const argv = await timed(n, 200, () => api.commands.run(['true']));
    rows.push({ name: "commands.run(['true']) argv, no shell", transport: 'host-unix', n, unit: 'us', ...argv, target: 'p50 <= 1000 us', meetsTarget: argv.p50 <= 1000 });
    // The host's own floor for the same work: bash forking and waiting for /bin/true.
    const loops = 500;
    const t0 = process.hrtime.bigint();
    await api.commands.run(['bash', '-c', `for i in $(seq ${loops}); do /bin/true; done`]);
    const floorUs = Math.round(Number(process.hrtime.bigint() - t0) / 1000 / loops);
    rows.push({ name: 'reference: fork+exec+wait of /bin/true inside bash', transport: 'host-unix', n: loops, unit: 'us', mean: floorUs });
    const shell = await timed(n, 200, () => api.commands.run('true'));
    rows.push({ name: "commands.run('true') via bash -lc", transport: 'host-unix', n, unit: 'us', ...shell });

    const data = randomBytes(fileMiB * 1024 * 1024);
    const path = join(dir, 'file');
    const tw = process.hrtime.bigint();
    await api.files.write(path, data);
    const writeS = Number(process.hrtime.bigint() - tw) / 1e9;
    const tr = process.hrtime.bigint();
    const back = await api.files.read(path, { format: 'bytes' });
    const readS = Number(process.hrtime.bigint() - tr) / 1e9;
    if (back.length !== data.length) throw new Error('file read back has the wrong size');
    const mibs = (s: number) => Math.round((fileMiB / s) * 10) / 10;
    rows.push({ name: `files.write ${fileMiB} MiB (fsync + rename)`, transport: 'host-unix', n: 1, unit: 'MiB/s', value: mibs(writeS) });
    rows.push({ name: `files.read ${fileMiB} MiB`, transport: 'host-unix', n: 1, unit: 'MiB/s', value: mibs(readS) });
  } finally {
    await client.close();
    await agent.stop();
    await rm(dir, { recursive: true, force: true });
  }
  rows.push(...(await vsockPingRows(Math.min(n, 500))));
  const { hostname } = await import('node:os');
  return { rows, json: { bench: 'agent', date: new Date().toISOString(), node: process.version, host: hostname(), rows } };
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const result = await runAgentBench();
  console.log(formatTable(result.rows));
  const out = join(dirname(fileURLToPath(import.meta.url)), 'results', 'agent.json');
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, JSON.stringify(result.json, null, 2) + '\n');
  console.log(`\nwritten to ${out}`);
}
