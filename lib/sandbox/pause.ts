// What a pause writes (docs/sandbox-lifecycle.md): the guest told to sync, its machine captured
// into the sandbox's next generation (GuestRun.capture), then meta.json saying `paused` with the
// disk as that generation names it, and the files no generation names any more removed.
import type { AgentClient } from '../agent/client.js';
import { dropUnreferencedLayers, frozenDiskTop, metaLayerPath } from '../store/generations.js';
import type { SandboxDir, SandboxMeta } from '../store/sandbox-dir.js';
import type { SnapshotResult } from '../vm/machine.js';
import { syncGuest } from './guest-requests.js';
import type { Running } from './resume.js';

/** How long the guest has to answer SYNC before a pause captures without it. */
const SYNC_TIMEOUT_MS = 10_000;

/** SYNC before the capture, so that a boot from the generation's disk holds every file written. */
export async function syncBeforeCapture(client: AgentClient): Promise<void> {
  try {
    await syncGuest(client, SYNC_TIMEOUT_MS);
  } catch {
    // A guest whose agent does not answer is captured anyway: memory and disk taken at one
    // instant are consistent; only a boot from this generation's disk would miss unsynced data.
  }
}

export type PausedMeta = SandboxMeta & { diskLayers: string[] };

/** The sandbox's meta.json once `snap` was captured from `run` at `pausedAt`. */
export function pausedMeta(dir: SandboxDir, meta: SandboxMeta, run: Running, snap: SnapshotResult, pausedAt: Date): PausedMeta {
  // The disk as the generation names it: the addon may have merged older layers into one.
  const diskLayers = snap.diskLayers[0]?.map((p) => metaLayerPath(dir, p)) ?? [...run.diskLayers, frozenDiskTop(snap.generation)];
  const { liveCapture: _liveCapture, ...rest } = meta;
  return {
    ...rest,
    state: 'paused',
    ownerPid: null,
    generation: snap.generation,
    pausedAt: pausedAt.toISOString(),
    diskLayers,
  };
}

/** Writes the paused meta.json; once it is durable, what the generation no longer names goes. */
export async function recordPaused(dir: SandboxDir, meta: PausedMeta): Promise<void> {
  const { diskLayers } = meta;
  await dir.writeMeta(meta);
  await dir.dropUnusedTops(diskLayers).catch(() => undefined);
  // meta.json is durable: what this generation no longer names goes.
  // Checkpoints keep their generations' files.
  const checkpoints = (meta.checkpoints ?? []).map((c) => c.generation);
  await dropUnreferencedLayers(dir, diskLayers, checkpoints).catch(() => undefined);
  // meta.json writes a killed owner left half done.
  await dir.dropStaleMetaTemps().catch(() => undefined);
}
