// Checkpoints (docs/sandbox-lifecycle.md#checkpoints): a generation written while the sandbox
// runs on, kept with its files until it is removed or restored past, and restored later to undo
// what happened since. A checkpoint is a generation like a pause's (the same capture, a diff of
// the pages written since the last one; the disk top frozen into it), so a restore is the
// sandbox's own connect after `current` is pointed back at it.
//
// The directory stays linear: restoring checkpoint G removes the generations after G (and the
// checkpoints among them), then the next capture writes G + 1 again.
import { readdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { frozenDiskTop, metaLayerPath } from '../store/generations.js';
import type { CheckpointRecord, SandboxDir, SandboxMeta } from '../store/sandbox-dir.js';
import { generationLayout, readGenerationFiles, writeCurrent } from '../store/snapshot-files.js';
import { syncBeforeCapture } from './pause.js';
import type { SnapshotResult } from '../vm/machine.js';
import type { Running } from './resume.js';

/** A checkpoint of a sandbox, as {@link Sandbox.checkpoints} lists it. */
export interface Checkpoint {
  /** Its id (the generation it wrote): what restore() and removeCheckpoint() take. */
  id: number;
  /** The label it was given, if any. */
  label?: string;
  /** When it was written. */
  createdAt: Date;
  /** Bytes its own generation holds on disk (the pages written since the generation before it,
   *  the disk blocks written since then, the machine state). */
  bytes: number;
  /** How long the guest was stopped for the capture, in ms (only on what checkpoint() returns). */
  stoppedMs?: number;
}

/** At most this many checkpoints per sandbox: each pins a generation's files. */
export const MAX_CHECKPOINTS = 64;

/**
 * Captures a running sandbox into its next generation while it runs on (a checkpoint's and a
 * fork's capture): the guest syncs, the machine is captured and continues. meta.json says
 * `liveCapture` while the capture runs (an owner that dies then lost what ran after it), then
 * records the generation and its disk, with `record(generation, at)`'s checkpoint when given.
 * Returns the new meta, the disk layers under the machine's new top, and the capture.
 */
export async function captureLive(
  dir: SandboxDir,
  meta: SandboxMeta,
  run: Running,
  record?: (generation: number, at: Date) => CheckpointRecord,
): Promise<{ meta: SandboxMeta; diskLayers: string[]; snap: SnapshotResult; at: Date }> {
  // The guest syncs while meta.json says liveCapture: both must be done before the capture.
  const synced = syncBeforeCapture(run.guest.client);
  try {
    await dir.writeMeta({ ...meta, liveCapture: true });
  } catch (err) {
    await synced;
    throw err;
  }
  let snap: SnapshotResult;
  try {
    await synced;
    snap = await run.guest.machine.snapshot(dir.snapshots);
  } catch (err) {
    await dir.writeMeta(meta).catch(() => undefined);
    throw err;
  }
  const at = new Date();
  // The disk as the generation names it (the addon may have merged older layers into one).
  const diskLayers = snap.diskLayers[0]?.map((p) => metaLayerPath(dir, p)) ?? [...run.diskLayers, frozenDiskTop(snap.generation)];
  const next: SandboxMeta = { ...meta, generation: snap.generation, diskLayers };
  if (record) next.checkpoints = [...(meta.checkpoints ?? []), record(snap.generation, at)];
  delete next.liveCapture;
  await dir.writeMeta(next);
  return { meta: next, diskLayers, snap, at };
}

/** Writes a checkpoint of a running sandbox (captureLive, recorded as a checkpoint). */
export async function writeCheckpoint(
  dir: SandboxDir,
  meta: SandboxMeta,
  run: Running,
  label: string | undefined,
): Promise<{ meta: SandboxMeta; diskLayers: string[]; checkpoint: Checkpoint }> {
  if ((meta.checkpoints?.length ?? 0) >= MAX_CHECKPOINTS) {
    throw new TorporError('INVALID_STATE', `sandbox ${meta.id} has ${MAX_CHECKPOINTS} checkpoints, the most it keeps: remove one (removeCheckpoint) first`);
  }
  const withLabel = label !== undefined ? { label } : {};
  const r = await captureLive(dir, meta, run, (generation, at) => ({ generation, createdAt: at.toISOString(), ...withLabel }));
  const checkpoint: Checkpoint = { id: r.snap.generation, createdAt: r.at, bytes: r.snap.bytes, stoppedMs: r.snap.capturedMs, ...withLabel };
  return { meta: r.meta, diskLayers: r.diskLayers, checkpoint };
}

/** The checkpoints meta.json records whose generation is still there, with the bytes each holds. */
export async function listCheckpoints(dir: SandboxDir, meta: SandboxMeta): Promise<Checkpoint[]> {
  const out: Checkpoint[] = [];
  for (const c of meta.checkpoints ?? []) {
    const genDir = join(dir.snapshots, generationLayout(c.generation).dir);
    const names = await readdir(genDir).catch(() => null);
    if (!names) continue;
    let bytes = 0;
    for (const n of names) bytes += await stat(join(genDir, n)).then((s) => s.blocks * 512, () => 0);
    out.push({ id: c.generation, createdAt: new Date(c.createdAt), bytes, ...(c.label !== undefined ? { label: c.label } : {}) });
  }
  return out;
}

/** The checkpoint `which` names (an id, a Checkpoint, or a label) among meta's; INVALID_ARGUMENT
 *  naming the ones there are when there is none. */
export function findCheckpoint(meta: SandboxMeta, which: number | string | { id: number }): CheckpointRecord {
  const all = meta.checkpoints ?? [];
  const found =
    typeof which === 'string' ? all.filter((c) => c.label === which).pop() : all.find((c) => c.generation === (typeof which === 'number' ? which : which?.id));
  if (!found) {
    const known = all.map((c) => (c.label ? `${c.generation} (${c.label})` : String(c.generation))).join(', ') || 'none';
    throw new TorporError('INVALID_ARGUMENT', `sandbox ${meta.id} has no checkpoint ${JSON.stringify(typeof which === 'object' ? which?.id : which)}; it has: ${known}`);
  }
  return found;
}

/**
 * Points a paused sandbox (whose owner lock the caller holds, its machine stopped) back at
 * checkpoint `c`: `current` names its generation, the generations after it go (with their
 * checkpoints), and meta.json says paused at it with the disk it froze. The next connect
 * restores it. The checkpoint's generation is validated first: a damaged one refuses
 * (SNAPSHOT_INVALID) before anything changes.
 */
export async function rewindTo(dir: SandboxDir, meta: SandboxMeta, c: CheckpointRecord): Promise<SandboxMeta> {
  readGenerationFiles(dir.snapshots, c.generation);
  const diskLayers = (await dir.diskLayersAt({ ...meta, generation: c.generation }, c.generation)).map((p) => dir.metaPathOf(p));
  const next: SandboxMeta = {
    ...meta,
    state: 'paused',
    ownerPid: null,
    generation: c.generation,
    pausedAt: c.createdAt,
    diskLayers,
    checkpoints: (meta.checkpoints ?? []).filter((k) => k.generation <= c.generation),
  };
  delete next.liveCapture;
  // `current` first (durable): from here a connect restores the checkpoint whatever happens
  // next; the later generations are then only files nothing names.
  await writeCurrent(dir.snapshots, c.generation);
  await dir.writeMeta(next);
  for (const name of await readdir(dir.snapshots)) {
    const m = /(\d+)$/.exec(name);
    const g = m ? Number(m[1]) : 0;
    if (g > c.generation && generationLayout(g).dir === name) await rm(join(dir.snapshots, name), { recursive: true, force: true });
  }
  return next;
}

/**
 * A rewind a process died in the middle of: `current` names a checkpoint older than meta.json's
 * generation. Finished as rewindTo would have (meta.json at that checkpoint, the generations
 * after it removed), so the next capture never builds on a later generation's leftovers. A
 * directory without that mismatch is returned as it is.
 */
export async function completeRewind(dir: SandboxDir, meta: SandboxMeta, current: number): Promise<SandboxMeta> {
  if (current === 0 || meta.generation === undefined || current >= meta.generation) return meta;
  const c = meta.checkpoints?.find((k) => k.generation === current);
  return c ? rewindTo(dir, meta, c) : meta;
}
