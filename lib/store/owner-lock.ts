// The owner lock of a sandbox (DESIGN §5): one process runs a sandbox at a time. An exclusive
// flock on <dir>/owner.lock, taken without waiting; the kernel drops it when the holder dies
// (even by SIGKILL), so a dead owner's lock is free again. The file holds the owner's pid, for
// SANDBOX_BUSY's message only: the flock is what excludes.
//
// Interim: a `flock --nonblock` child process holds the lock while its stdin stays open (as
// lib/store/lock.ts does for builds), until the addon-backed tryLock of lib/store/lock.ts lands.
import { spawn } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';

import { TorporError } from '../errors.js';

export interface OwnerLock {
  readonly path: string;
  release(): Promise<void>;
}

export type TakeResult = { ok: true; lock: OwnerLock } | { ok: false; ownerPid: number | null };

const BUSY_EXIT = 75;

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Takes the lock at `path` if it is free; otherwise says who holds it (pid, when known). */
export async function takeOwnerLock(path: string): Promise<TakeResult> {
  // An owner that just died: its helper exits a moment later (it reads end-of-file first).
  for (let i = 0; ; i++) {
    const r = await tryOnce(path);
    if (r.ok || r.ownerPid === null || pidAlive(r.ownerPid) || i >= 40) return r;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

async function tryOnce(path: string): Promise<TakeResult> {
  const child = spawn(
    'flock',
    ['--exclusive', '--nonblock', '--conflict-exit-code', String(BUSY_EXIT), path, 'sh', '-c', 'echo locked; exec cat >/dev/null'],
    { stdio: ['pipe', 'pipe', 'pipe'] },
  );
  const outcome = await new Promise<'locked' | { code: number | null; stderr: string } | Error>((resolve) => {
    let stderr = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk: string) => {
      if (chunk.includes('locked')) resolve('locked');
    });
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk: string) => (stderr += chunk));
    child.on('error', (err) => resolve(err));
    child.on('exit', (code) => resolve({ code, stderr }));
  });
  if (outcome instanceof Error) {
    throw new TorporError('MISSING_TOOLS', `cannot run flock (install the Debian package util-linux): ${outcome.message}`, { cause: outcome });
  }
  if (outcome !== 'locked') {
    if (outcome.code === BUSY_EXIT) {
      const text = await readFile(path, 'utf8').catch(() => '');
      const pid = Number.parseInt(text, 10);
      return { ok: false, ownerPid: Number.isInteger(pid) && pid > 0 ? pid : null };
    }
    throw new TorporError('IO_ERROR', `cannot lock ${path}: flock exited ${outcome.code}: ${outcome.stderr.trim()}`);
  }
  child.stdout.removeAllListeners('data');
  child.removeAllListeners('exit');
  // The helper must not keep the event loop alive: the lock lives as long as this process.
  child.unref();
  for (const s of [child.stdin, child.stdout, child.stderr]) (s as unknown as { unref?: () => void }).unref?.();
  await writeFile(path, `${process.pid}\n`);
  let released = false;
  return {
    ok: true,
    lock: {
      path,
      async release(): Promise<void> {
        if (released) return;
        released = true;
        child.ref();
        const exited = new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) resolve();
          else child.once('exit', () => resolve());
        });
        child.stdin.end();
        await exited;
      },
    },
  };
}
