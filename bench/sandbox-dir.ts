// What every new sandbox pays on disk around its guest's start, without KVM: its directory
// made, the owner lock taken, meta.json 'starting' (openSandboxDir, create.ts), then meta.json
// 'running', each written durably, for one sandbox and for ten at once (a fork of 10's share of
// its time beside machine.fork, bench/fork.ts). Under a TORPOR_HOME beside the real one: the
// same filesystem.
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

/** One new sandbox's directory work as create and fork do it; resolves to its lock's release. */
async function newSandboxDir(home: string): Promise<() => Promise<void>> {
  const dir = new SandboxDir(newSandboxId(), home);
  const meta = startingMeta(dir);
  const lock = await openSandboxDir(dir, meta, new UndoStack());
  await dir.writeMeta({ ...meta, state: 'running' });
  return () => lock.release();
}

export async function runSandboxDirBench(opts: { rounds?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const rounds = opts.rounds ?? ROUNDS;
  await mkdir(dirname(torporHome()), { recursive: true });
  const home = await mkdtemp(join(dirname(torporHome()), '.torpor-bench-dir-'));
  const samples = new Map<number, number[]>();
  try {
    for (let i = 0; i < rounds + 1; i++) {
      for (const count of [1, 10]) {
        const t0 = performance.now();
        const releases = await Promise.all(Array.from({ length: count }, () => newSandboxDir(home)));
        const ms = performance.now() - t0;
        await Promise.all(releases.map((r) => r()));
        if (i > 0) samples.set(count, [...(samples.get(count) ?? []), ms]); // the first round warms the caches
      }
    }
  } finally {
    await rm(home, { recursive: true, force: true });
  }
  const row = (name: string, count: number, note: string): BenchRow => ({ name, n: rounds, unit: 'ms', ...summarize(samples.get(count)!), note });
  const rows = [
    row('a new sandbox: directory, owner lock, meta.json starting then running', 1, 'four fsyncs: each meta.json and its directory'),
    row('10 new sandboxes at once (a fork of 10)', 10, 'concurrent, as fork starts its children'),
  ];
  return { rows, json: { bench: 'sandbox-dir', date: new Date().toISOString(), node: process.version, rounds, rows } };
}
