// What Sandbox.getInfo / Sandbox.list report, from meta.json and the directory.
import type { CreatedFrom, OnTimeout, ResumedFrom, SandboxMeta } from '../store/sandbox-dir.js';
import type { SandboxState } from './lifecycle.js';

/** What a sandbox is and where it stands: {@link Sandbox.getInfo} and {@link Sandbox.list} report it. */
export interface SandboxInfo {
  /** The sandbox's id. */
  sandboxId: string;
  /** Its state; one whose owner process died is reported `paused` (connect recovers it). */
  state: SandboxState;
  /** The template it was created from ('base', or a name given to Template.build). */
  template: string;
  /** 'template': restored from the warm template (the first pause writes only what changed since);
   *  'boot': booted (template: false, or the template could not be used: `bootReason`);
   *  'fork': made by another sandbox's fork() (`forkedFrom`). */
  createdFrom?: CreatedFrom;
  /** The sandbox it was forked from (createdFrom 'fork'). */
  forkedFrom?: string;
  /** Its checkpoints, oldest first (sbx.checkpoints() adds the bytes each holds). */
  checkpoints?: Array<{
    /** What restore() takes. */
    id: number;
    /** Its label, if it was given one. */
    label?: string;
    /** When it was written. */
    createdAt: Date;
  }>;
  /** Why it was booted rather than restored from the template (createdFrom 'boot' only). */
  bootReason?: string;
  /** The labels given to create. */
  metadata: Record<string, string>;
  /** The machine's size (the one spelling getInfo reports; cpuCount and memoryMiB repeat it for older callers). */
  resources: {
    /** vCPUs. */
    cpu: number;
    /** RAM, MiB. */
    memoryMb: number;
    /** Root disk, MiB (0 when not recorded). */
    diskMb: number;
  };
  /** Same as resources.cpu (kept for older callers). */
  cpuCount: number;
  /** Same as resources.memoryMb (kept for older callers). */
  memoryMiB: number;
  /** When it was created. */
  createdAt: Date;
  /** When it was last paused. */
  pausedAt?: Date;
  /** When it was last resumed (connect). */
  resumedAt?: Date;
  /** What the last resume continued from: 'memory' (the guest went on) or 'disk' (booted from the generation's disk). */
  resumedFrom?: ResumedFrom;
  /** Why the last resume booted from disk instead of continuing from memory. */
  resumeReason?: string;
  /** A dead owner's sandbox that a connect recovered: work done between these times is lost. */
  lostInterval?: {
    /** Since when: the last resume, pause or creation before the owner died. */
    from: Date;
    /** When the connect recovered it. */
    to: Date;
  };
  /** What the dead owner's interval (`lostInterval`) cost: 'processes' (its disk was booted,
   *  every file it synced kept) or 'processes-and-files' (a generation was restored). */
  lost?: 'processes' | 'processes-and-files';
  /** The live process that owns it, when one does. */
  ownerPid: number | null;
  /** The generation a connect continues from (0: none yet). */
  generation: number;
  /** Bytes its directory takes on disk. */
  bytesOnDisk: number;
  /** The lifecycle timeout (ms without activity), when one is set. */
  timeoutMs?: number;
  /** What the timeout does: 'kill' or 'pause'. */
  onTimeout?: OnTimeout;
  /** E2B's name for `template`. */
  templateId: string;
  /** E2B's name: when the sandbox's current run started (its last resume, else its creation). */
  startedAt: Date;
  /** E2B's name: when the lifecycle timeout ends this run if nothing happens before (the last
   *  activity plus `timeoutMs`); only while this process runs it with a timeout. */
  endAt?: Date;
}

export function infoOf(meta: SandboxMeta, state: SandboxState, ownerPid: number | null, generation: number, bytesOnDisk: number): SandboxInfo {
  const info: SandboxInfo = {
    sandboxId: meta.id,
    state,
    template: meta.template,
    templateId: meta.template,
    startedAt: new Date(meta.resumedAt ?? meta.createdAt),
    metadata: { ...meta.metadata },
    resources: { cpu: meta.vcpus, memoryMb: meta.memoryMiB, diskMb: meta.diskMb ?? 0 },
    cpuCount: meta.vcpus,
    memoryMiB: meta.memoryMiB,
    createdAt: new Date(meta.createdAt),
    ownerPid,
    generation,
    bytesOnDisk,
  };
  if (meta.createdFrom) info.createdFrom = meta.createdFrom;
  if (meta.forkedFrom) info.forkedFrom = meta.forkedFrom;
  if (meta.checkpoints?.length) {
    info.checkpoints = meta.checkpoints.map((c) => ({ id: c.generation, createdAt: new Date(c.createdAt), ...(c.label !== undefined ? { label: c.label } : {}) }));
  }
  if (meta.bootReason) info.bootReason = meta.bootReason;
  if (meta.pausedAt) info.pausedAt = new Date(meta.pausedAt);
  if (meta.resumedAt) info.resumedAt = new Date(meta.resumedAt);
  if (meta.resumedFrom) info.resumedFrom = meta.resumedFrom;
  if (meta.resumeReason) info.resumeReason = meta.resumeReason;
  if (meta.lostInterval) info.lostInterval = { from: new Date(meta.lostInterval.from), to: new Date(meta.lostInterval.to) };
  if (meta.lost) info.lost = meta.lost;
  if (meta.timeoutMs) info.timeoutMs = meta.timeoutMs;
  if (meta.onTimeout) info.onTimeout = meta.onTimeout;
  return info;
}
