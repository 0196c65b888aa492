// Inter-process exclusive lock for building one artifact.
//
// Node has no flock(2), so a child `flock` process (util-linux) takes the lock
// and holds it while its stdin stays open. The kernel releases a flock when its
// holder dies, so a builder killed mid-build (even with SIGKILL) never leaves a
// stale lock behind: its pipe closes, the child exits, the next waiter proceeds.
// The lock file is never unlinked (unlinking a flock'd path lets two processes
// lock two different inodes); it holds the owner's pid for messages only.
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import type { Readable, Writable } from 'node:stream';

import { TorporError } from '../errors.js';

export interface HeldLock {
  readonly path: string;
  release(): Promise<void>;
}

export interface LockOptions {
  /** Called once if the lock is not free within waitNoticeMs, with the holder's pid when known. */
  onWait?: (ownerPid: number | undefined) => void;
  waitNoticeMs?: number;
  /** Give up after this long (default: wait forever; builds take minutes). */
  timeoutMs?: number;
}

export async function acquireLock(path: string, options: LockOptions = {}): Promise<HeldLock> {
  let child: ChildProcessByStdio<Writable, Readable, Readable>;
  try {
    child = spawn('flock', ['--exclusive', path, 'sh', '-c', 'echo locked; exec cat >/dev/null'], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
  } catch (err) {
    throw new TorporError('MISSING_TOOLS', 'cannot run flock (install the Debian package util-linux)', { cause: err });
  }

  await new Promise<void>((resolve, reject) => {
    let stderr = '';
    let settled = false;
    const finish = (err?: Error): void => {
      if (settled) return;
      settled = true;
      clearTimeout(notice);
      if (timeout) clearTimeout(timeout);
      if (err) {
        child.kill('SIGKILL');
        reject(err);
      } else resolve();
    };
    const notice = setTimeout(() => {
      readFile(path, 'utf8').then(
        (text) => options.onWait?.(Number.parseInt(text, 10) || undefined),
        () => options.onWait?.(undefined),
      );
    }, options.waitNoticeMs ?? 250);
    const timeout =
      options.timeoutMs === undefined
        ? undefined
        : setTimeout(() => finish(new TorporError('TIMEOUT', `timed out waiting for lock ${path}`)), options.timeoutMs);
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk: string) => {
      if (chunk.includes('locked')) finish();
    });
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk: string) => (stderr += chunk));
    child.on('error', (err: NodeJS.ErrnoException) => {
      const missing = err.code === 'ENOENT';
      finish(
        new TorporError(
          missing ? 'MISSING_TOOLS' : 'IO_ERROR',
          missing ? 'flock is not installed; install the Debian package util-linux' : `cannot lock ${path}: ${err.message}`,
          { cause: err },
        ),
      );
    });
    child.on('exit', (code) => {
      const denied = /Permission denied|Read-only file system/.test(stderr);
      finish(
        new TorporError(
          denied ? 'PERMISSION_DENIED' : 'IO_ERROR',
          `cannot lock ${path}: flock exited ${code}: ${stderr.trim()}` +
            (denied ? '. Run as the user who owns this directory, or set TORPOR_HOME to a directory you own.' : ''),
        ),
      );
    });
  });

  // For "waiting for pid N" messages only; the flock is what excludes.
  await writeFile(path, `${process.pid}\n`).catch(() => undefined);

  let released = false;
  return {
    path,
    async release(): Promise<void> {
      if (released) return;
      released = true;
      child.removeAllListeners('exit');
      const exited = new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) resolve();
        else child.once('exit', () => resolve());
      });
      child.stdin.end();
      await exited;
    },
  };
}
