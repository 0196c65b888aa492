// The owner lock of a sandbox (DESIGN §5): one process runs a sandbox at a time. An exclusive
// flock on <dir>/owner.lock (lib/store/lock.ts tryLock: taken in the addon, without waiting);
// the kernel drops it when the holder dies (even by SIGKILL), so a dead owner's lock is free
// again at once. The file holds the owner's pid, for SANDBOX_BUSY's message only.
import { tryLock, type HeldLock } from './lock.js';

export type OwnerLock = HeldLock;

export type TakeResult = { ok: true; lock: OwnerLock } | { ok: false; ownerPid: number | null };

/** Takes the lock at `path` if it is free; otherwise says who holds it (pid, when known). */
export async function takeOwnerLock(path: string): Promise<TakeResult> {
  return tryLock(path);
}
