// The owner lock of a sandbox (docs/architecture.md#durability-and-ownership): one process runs a sandbox at a time. An exclusive
// flock on <dir>/owner.lock (lib/store/lock.ts tryLock: taken in the addon, without waiting);
// the kernel drops it when the holder dies (even by SIGKILL), so a dead owner's lock is free
// again at once. The file holds the owner's pid, for SANDBOX_BUSY's message only.
//
// "At once" has one exception: a lock is an open file description, and a process that forks
// shares it with the child until the child's exec closes it (O_CLOEXEC). An owner killed while
// a child it was starting (passt) sat between fork and exec leaves the lock held by that child
// for as long as the scheduler keeps it there: on a loaded host, tens of milliseconds. So a lock
// whose recorded owner is dead is tried again for a short while before it counts as busy.
import { tryLock, type HeldLock } from './lock.js';
import { processAlive } from './process-alive.js';

export type OwnerLock = HeldLock;

export type TakeResult = { ok: true; lock: OwnerLock } | { ok: false; ownerPid: number | null };

/** How long a lock whose recorded owner is dead may take to be let go. */
const DEAD_OWNER_GRACE_MS = 3000;

/** Takes the lock at `path` if it is free; otherwise says who holds it (pid, when known). */
export async function takeOwnerLock(path: string): Promise<TakeResult> {
  const deadline = Date.now() + DEAD_OWNER_GRACE_MS;
  for (;;) {
    const r = tryLock(path);
    if (r.ok || r.ownerPid === null || processAlive(r.ownerPid) || Date.now() >= deadline) return r;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
