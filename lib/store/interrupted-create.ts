// What a create or a fork's child leaves under sandboxes/ when its process or the host dies
// between making the sandbox's directory and renaming its first meta.json into place
// (lib/sandbox/create.ts openSandboxDir): a directory with no meta.json, perhaps its owner.lock
// and a meta.json temporary file. Nobody was handed that sandbox and no call can name it
// (Sandbox.list leaves it out, connect answers SANDBOX_NOT_FOUND), so `torpor prune` removes
// it. A directory whose meta.json is there, readable or not, is a sandbox: never taken here.
import { readFile, stat } from 'node:fs/promises';

import { torporHome } from './home.js';
import { tryLock } from './lock.js';
import { processAlive } from './process-alive.js';
import { SandboxDir, sandboxIds } from './sandbox-dir.js';

/** The youngest directory taken for an interrupted create, whatever the cutoff. */
const MIN_AGE_MS = 60_000;

/**
 * Removes (or, with `dryRun`, only names) the directories of interrupted creates last changed
 * before `cutoffMs` (ms since the epoch), and a minute ago at the latest: no meta.json and
 * nobody holding the owner lock. The minute keeps a create in its first moments (directory
 * made, lock not yet taken) out of reach whatever the cutoff. A dry run changes nothing: it
 * judges the lock by the live pid recorded in it. Resolves to their ids.
 */
export async function pruneInterruptedCreates(cutoffMs: number, opts: { dryRun?: boolean; home?: string } = {}): Promise<string[]> {
  const found: string[] = [];
  const before = Math.min(cutoffMs, Date.now() - MIN_AGE_MS);
  const home = opts.home ?? torporHome();
  for (const id of await sandboxIds(home)) {
    const dir = new SandboxDir(id, home);
    if (await dir.exists()) continue;
    const changed = await stat(dir.path).then((s) => s.mtimeMs, () => null);
    if (changed === null || changed > before) continue;
    if (opts.dryRun) {
      if (!(await recordedOwnerAlive(dir.lockPath))) found.push(id);
      continue;
    }
    // Taken even where there is no lock file yet: a create that comes back to this directory
    // then meets SANDBOX_BUSY rather than a directory pulled from under it.
    const taken = tryLock(dir.lockPath);
    if (!taken.ok) continue; // a process is creating it after all
    try {
      if (await dir.exists()) continue; // written between the look and the lock
      await dir.remove();
      found.push(id);
    } finally {
      await taken.lock.release();
    }
  }
  return found;
}

/** Whether the pid an owner.lock records is a live process (no file, or no pid in it: no). */
async function recordedOwnerAlive(lockPath: string): Promise<boolean> {
  const text = await readFile(lockPath, 'utf8').catch(() => '');
  const pid = /^\s*(\d{1,10})\s*$/.exec(text)?.[1];
  return pid !== undefined && processAlive(Number(pid));
}
