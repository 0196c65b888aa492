// Sandbox.connect's work (docs/sandbox-lifecycle.md): from memory when the current generation
// can be restored and its agent answers, else from that generation's disk; RESUMED (host clock,
// fresh entropy, the sandbox's identity: identity.ts) before anything else; what happened
// recorded in meta.json. A sandbox with a network gets a fresh backend (passt) for the new run,
// attached before the guest runs again: same MAC (RESUMED names it; a disk boot builds the
// device with it), same addresses, its forwarded ports bound again (the same host ports where
// still free).
import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';

import { SandboxNetwork } from '../net/sandbox-network.js';
import type { OwnerLock } from '../store/owner-lock.js';
import type { ResumedFrom, SandboxDir, SandboxMeta } from '../store/sandbox-dir.js';
import { completeRewind, findCheckpoint, rewindTo } from './checkpoints.js';
import { GuestRun, reasonOf, type GuestStart } from './guest-run.js';
import { sandboxIdentity } from './identity.js';
import { guestMachineOptions } from './readiness.js';
import { UndoStack } from './undo-stack.js';

/** How {@link Sandbox.connect} continues a sandbox. Every field is optional. */
export interface ConnectOpts {
  /** 'restore' (default): continue from memory, booting the same generation's disk when the
   *  memory image cannot be used; 'reboot': boot that disk. */
  onResume?: 'restore' | 'reboot';
  /** How long a restored guest's agent has to answer before the disk is booted instead (default 10 s). */
  restoreTimeoutMs?: number;
  /** How long a boot from disk waits for the agent (default 30 s). */
  bootTimeoutMs?: number;
  /** What `await using` does with the connected sandbox: 'kill' (default) or 'pause'. */
  onDispose?: 'kill' | 'pause';
  /**
   * A sandbox whose owner process died while running it: 'disk' (default) boots the disk the dead
   * machine last wrote (crash-consistent: every file it synced is there; its processes restart),
   * 'memory' restores the last generation instead (processes continue from that pause; files
   * written after it are lost). Files are what must never be lost, hence the default.
   */
  onOwnerDeath?: 'disk' | 'memory';
  /** Abort the connect: it rejects with AbortError (ABORTED) and the sandbox stays paused (one
   *  already running again is paused again first). */
  signal?: AbortSignal;
  /** Continue from this checkpoint (its id, a label, or what checkpoint() returned) instead of the
   *  last generation: what ran since it is discarded, and the checkpoints after it go. */
  checkpoint?: number | string | { id: number };
}

/** What a running sandbox is made of; replaced whole after a resume. */
export interface Running {
  /** Its machine, agent client and network backend (the backend: a sandbox created with a network). */
  guest: GuestRun;
  lock: OwnerLock;
  /** Disk layers under the machine's top (relative to the directory; a template's absolute): what the next pause adds to. */
  diskLayers: string[];
}

/** Since when a dead owner's work is lost: the generation it is recovered from was captured at
 *  `pausedAt`, and the machine ran again from `resumedAt` (or from creation, never paused). */
function lostSince(meta: SandboxMeta, generation: number): string {
  if (generation === 0) return meta.createdAt;
  // A checkpoint: the machine ran on from the moment it was written.
  const checkpoint = meta.checkpoints?.find((c) => c.generation === generation);
  if (checkpoint) return checkpoint.createdAt;
  return meta.resumedAt && meta.pausedAt && meta.resumedAt > meta.pausedAt ? meta.resumedAt : (meta.pausedAt ?? meta.createdAt);
}

/**
 * Continues a sandbox whose owner lock the caller holds (Sandbox.connect): restores the current
 * generation, or boots that generation's disk (onResume 'reboot', a memory image that cannot be
 * used, a restored guest that does not answer, no generation at all), sends RESUMED, and records
 * the outcome in meta.json. On failure meta.json is put back as it was.
 */
export async function resume(dir: SandboxDir, before: SandboxMeta, lock: OwnerLock, opts: ConnectOpts): Promise<{ meta: SandboxMeta; run: Running }> {
  // Back to a checkpoint first (durable before anything restores it); or the rest of one a
  // process died in the middle of (`current` already behind meta.json's generation).
  if (opts.checkpoint !== undefined) before = await rewindTo(dir, before, findCheckpoint(before, opts.checkpoint));
  else before = await completeRewind(dir, before, await dir.currentGeneration());
  const generation = await dir.currentGeneration();
  const now = new Date();
  // Only a sandbox recorded as running (or pausing, starting) lost work: a crash while paused
  // or while resuming left its generation as it was. A generation newer than meta.json records
  // lost nothing either: every capture into a sandbox's snapshots ends its machine (a pause
  // killed before it wrote meta.json, a worker thread's teardown capture), so nothing ran after it.
  // A checkpoint's capture (liveCapture) is the exception: the machine ran on after it.
  const newerThanMeta = generation > (before.generation ?? 0) && !before.liveCapture;
  const ownerDied = !newerThanMeta && (before.state === 'running' || before.state === 'pausing' || before.state === 'starting');
  const lostInterval = ownerDied ? { from: lostSince(before, generation), to: now.toISOString() } : undefined;
  await dir.writeMeta({ ...before, state: 'resuming', ownerPid: process.pid });

  let resumedFrom: ResumedFrom = 'memory';
  let resumeReason: string | undefined;
  let diskLayers = (await dir.diskLayersAt(before, generation)).map((p) => dir.metaPathOf(p));
  const undo = new UndoStack();
  // Nothing was changed but meta.json's state: a failure puts it back.
  undo.defer(() => dir.writeMeta(before));
  try {
    // A fresh backend for this run (a sandbox with a network), its forwarded ports bound again.
    const start: Omit<GuestStart, 'agentTimeoutMs'> = {
      network: before.network ?? false,
      ...(before.hostPorts ? { hostPorts: before.hostPorts } : {}),
      identity: sandboxIdentity(before.id),
    };
    let guest: GuestRun | undefined;
    // The disk a dead owner's machine was writing since the generation (its top layer), for a boot
    // that keeps every file it synced.
    const deadTop = ownerDied && generation > 0 && opts.onOwnerDeath !== 'memory' ? await dir.adoptDeadOwnerTop(generation, before.ownerPid) : null;
    if (generation === 0) resumeReason = 'no generation: the sandbox was never paused';
    else if (deadTop) resumeReason = `its owner (pid ${before.ownerPid}) died: booted the disk its machine last wrote, so its files are kept and its processes restart (onOwnerDeath: 'memory' restores generation ${generation} instead)`;
    else if (opts.onResume === 'reboot') resumeReason = "onResume: 'reboot'";
    else {
      try {
        guest = await GuestRun.restore(dir.snapshots, {}, { ...start, agentTimeoutMs: opts.restoreTimeoutMs ?? 10_000 });
      } catch (err) {
        resumeReason = reasonOf(err);
      }
    }
    if (!guest) {
      resumedFrom = 'disk';
      // A sandbox never paused: its first top layer, as the dead owner's machine left it
      // (crash-consistent), under a new top; over the template's layers for a template sandbox.
      if (generation === 0) {
        if (before.createdFrom === 'template' || before.createdFrom === 'fork') await dir.adoptRestoreTop();
        const first = relative(dir.path, dir.firstOverlay);
        if (existsSync(dir.firstOverlay) && !diskLayers.includes(first)) diskLayers = [...diskLayers, first];
      }
      if (deadTop) diskLayers = [...diskLayers, relative(dir.path, deadTop)];
      const top = dir.bootTop(generation);
      await mkdir(dirname(top), { recursive: true });
      const options = guestMachineOptions(
        before,
        { base: before.rootfs, frozen: diskLayers.map((p) => (p.startsWith('/') ? p : join(dir.path, p))), overlay: top },
        { consoleLog: dir.consoleLog, ...(before.network ? { net: SandboxNetwork.machineOptions(before.id).net } : {}) },
      );
      guest = await GuestRun.boot(options, { ...start, agentTimeoutMs: opts.bootTimeoutMs ?? 30_000, resumed: true });
    }
    const started = guest;
    undo.defer(() => started.stop());
    const meta: SandboxMeta = { ...before, state: 'running', ownerPid: process.pid, resumedAt: new Date().toISOString(), resumedFrom };
    delete meta.liveCapture; // settled above: this run starts from a known generation
    if (generation) meta.generation = generation;
    meta.diskLayers = diskLayers;
    delete meta.resumeReason;
    if (resumeReason) meta.resumeReason = resumeReason;
    delete meta.lostInterval;
    delete meta.lost;
    if (lostInterval) {
      meta.lostInterval = lostInterval;
      // What the dead owner's interval cost: its processes always; its files only when they were not booted.
      meta.lost = deadTop || (generation === 0 && resumedFrom === 'disk') ? 'processes' : 'processes-and-files';
    }
    if (guest.network) meta.hostPorts = guest.network.hostPortsRecord();
    await dir.writeMeta(meta);
    undo.move();
    return { meta, run: { guest, lock, diskLayers } };
  } catch (err) {
    await undo.disposeAsync().catch(() => undefined);
    throw err;
  }
}
