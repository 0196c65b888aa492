// What every new sandbox pays on disk around its guest's start, without KVM: its directory
// made, the owner lock taken, meta.json written durably: 'starting' (openSandboxDir, create.ts)
// and 'running' for a create, 'running' only for a fork's child (startInNewDir's starting:
// false); one create, one child, and ten children at once (a fork of 10's share of its time
// beside machine.fork, bench/fork.ts). Under a TORPOR_HOME beside the real one: the same
// filesystem.
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';

import { openSandboxDir } from '../lib/sandbox/create.js';
import { UndoStack } from '../lib/sandbox/undo-stack.js';
import { torporHome } from '../lib/store/home.js';
import { newSandboxId, SandboxDir, type SandboxMeta } from '../lib/store/sandbox-dir.js';
import { type BenchRow, summarize } from './report.js';

const ROUNDS = 30;

function startingMeta(dir: SandboxDir): SandboxMeta {
  return {
    id: dir.id,
    template: 'base',
    createdAt: new Date().toISOString(),
    vcpus: 1,
    memoryMiB: 64,
    metadata: {},
    envs: {},
    kernel: '/bench/vmlinux',
    rootfs: '/bench/rootfs.ext4',
    cmdline: 'console=ttyS0',
    ownerPid: process.pid,
    state: 'starting',
  };
}

/** One new sandbox's directory work as create (`starting`) or a fork's child does it; resolves
 *  to its lock's release. */
async function newSandboxDir(home: string, starting: boolean): Promise<() => Promise<void>> {
  const dir = new SandboxDir(newSandboxId(), home);
  const meta = startingMeta(dir);
  const lock = await openSandboxDir(dir, starting ? meta : null, new UndoStack());
  await dir.writeMeta({ ...meta, state: 'running' });
  return () => lock.release();
}

const VARIANTS = [
  { key: 'create', count: 1, starting: true },
  { key: 'child', count: 1, starting: false },
  { key: 'fork10', count: 10, starting: false },
] as const;

export async function runSandboxDirBench(opts: { rounds?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const rounds = opts.rounds ?? ROUNDS;
  await mkdir(dirname(torporHome()), { recursive: true });
  const home = await mkdtemp(join(dirname(torporHome()), '.torpor-bench-dir-'));
  const samples = new Map<string, number[]>();
  try {
    for (let i = 0; i < rounds + 1; i++) {
      for (const v of VARIANTS) {
        const t0 = performance.now();
        const releases = await Promise.all(Array.from({ length: v.count }, () => newSandboxDir(home, v.starting)));
        const ms = performance.now() - t0;
        await Promise.all(releases.map((r) => r()));
        if (i > 0) samples.set(v.key, [...(samples.get(v.key) ?? []), ms]); // the first round warms the caches
      }
    }
  } finally {
    await rm(home, { recursive: true, force: true });
  }
  const row = (name: string, key: string, note: string): BenchRow => ({ name, n: rounds, unit: 'ms', ...summarize(samples.get(key)!), note });
  const rows = [
    row('Sandbox.create: directory, owner lock, meta.json starting then running', 'create', 'four fsyncs: each meta.json and its directory'),
    row("a fork's child: directory, owner lock, meta.json running", 'child', 'two fsyncs'),
    row("10 fork's children at once (a fork of 10)", 'fork10', 'concurrent, as fork starts its children'),
  ];
  return { rows, json: { bench: 'sandbox-dir', date: new Date().toISOString(), node: process.version, rounds, rows } };
}
