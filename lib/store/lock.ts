// Inter-process exclusive locks: an artifact being built, a sandbox's owner.
//
// The addon takes a flock(2) on an O_CLOEXEC fd this process holds
// (native/base/file_lock.h): per open file description, so two locks on one
// path exclude each other inside one process too, and released by the kernel
// when the fd closes or the process dies, SIGKILL included, so a dead holder
// never leaves a stale lock. The fd is a plain number here: a HeldLock keeps
// nothing on the event loop. The lock file is never unlinked (unlinking a
// flock'd path lets two processes lock two different inodes); it holds the
// owner's pid for messages only.
import { setTimeout as sleep } from 'node:timers/promises';

import { TorporError } from '../errors.js';
import { loadNative } from '../native.js';

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

/** Non-blocking: the lock, or who holds it (pid from the file; null if unreadable). */
export function tryLock(path: string): { ok: true; lock: HeldLock } | { ok: false; ownerPid: number | null } {
  const native = loadNative();
  let attempt: { fd: number } | { ownerPid: number | null };
  try {
    attempt = native.tryLockFile(path);
  } catch (err) {
    if (!(err instanceof TorporError) || err.code !== 'PERMISSION_DENIED') throw err;
    const hint = '. Run as the user who owns this directory, or set TORPOR_HOME to a directory you own.';
    throw new TorporError('PERMISSION_DENIED', err.message + hint, { errno: err.errno, cause: err });
  }
  if (!('fd' in attempt)) return { ok: false, ownerPid: attempt.ownerPid };
  const fd = attempt.fd;
  let released = false;
  const lock: HeldLock = {
    path,
    release(): Promise<void> {
      if (!released) {
        released = true;
        native.closeLockFile(fd);
      }
      return Promise.resolve();
    },
  };
  return { ok: true, lock };
}

// Waits poll with backoff (a blocking flock would hold a thread-pool worker for
// as long as a build takes): the first retries are quick, later ones 50 ms apart.
const FIRST_RETRY_MS = 1;
const MAX_RETRY_MS = 50;

export async function acquireLock(path: string, options: LockOptions = {}): Promise<HeldLock> {
  const started = performance.now();
  const noticeMs = options.waitNoticeMs ?? 250;
  let noticed = false;
  let delay = FIRST_RETRY_MS;
  for (;;) {
    const attempt = tryLock(path);
    if (attempt.ok) return attempt.lock;
    const waited = performance.now() - started;
    if (!noticed && waited >= noticeMs) {
      noticed = true;
      options.onWait?.(attempt.ownerPid ?? undefined);
    }
    if (options.timeoutMs !== undefined && waited >= options.timeoutMs) {
      const owner = attempt.ownerPid === null ? '' : ` (held by pid ${attempt.ownerPid})`;
      throw new TorporError('TIMEOUT', `timed out waiting for lock ${path}${owner}`);
    }
    let next = delay;
    if (!noticed) next = Math.min(next, Math.max(1, noticeMs - waited));
    if (options.timeoutMs !== undefined) next = Math.min(next, Math.max(1, options.timeoutMs - waited));
    await sleep(next);
    delay = Math.min(delay * 2, MAX_RETRY_MS);
  }
}
