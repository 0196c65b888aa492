// What Sandbox.getInfo / Sandbox.list report, from meta.json and the directory.
import type { CreatedFrom, OnTimeout, ResumedFrom, SandboxMeta } from '../store/sandbox-dir.js';
import type { SandboxState } from './lifecycle.js';

export interface SandboxInfo {
  sandboxId: string;
  state: SandboxState;
  template: string;
  /** 'template': restored from the warm template (the first pause writes only what changed since);
   *  'boot': booted (template: false, or the template could not be used: `bootReason`). */
  createdFrom?: CreatedFrom;
  bootReason?: string;
  metadata: Record<string, string>;
  /** The machine's size (the one spelling getInfo reports; cpuCount and memoryMiB repeat it for older callers). */
  resources: { cpu: number; memoryMb: number; diskMb: number };
  /** Same as resources.cpu (kept for older callers). */
  cpuCount: number;
  /** Same as resources.memoryMb (kept for older callers). */
  memoryMiB: number;
  createdAt: Date;
  pausedAt?: Date;
  resumedAt?: Date;
  resumedFrom?: ResumedFrom;
  /** Why the last resume booted from disk instead of continuing from memory. */
  resumeReason?: string;
  /** A dead owner's sandbox that a connect recovered: work done between these times is lost. */
  lostInterval?: { from: Date; to: Date };
  /** The live process that owns it, when one does. */
  ownerPid: number | null;
  /** The generation a connect continues from (0: none yet). */
  generation: number;
  /** Bytes its directory takes on disk. */
  bytesOnDisk: number;
  timeoutMs?: number;
  onTimeout?: OnTimeout;
}

export function infoOf(meta: SandboxMeta, state: SandboxState, ownerPid: number | null, generation: number, bytesOnDisk: number): SandboxInfo {
  const info: SandboxInfo = {
    sandboxId: meta.id,
    state,
    template: meta.template,
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
  if (meta.bootReason) info.bootReason = meta.bootReason;
  if (meta.pausedAt) info.pausedAt = new Date(meta.pausedAt);
  if (meta.resumedAt) info.resumedAt = new Date(meta.resumedAt);
  if (meta.resumedFrom) info.resumedFrom = meta.resumedFrom;
  if (meta.resumeReason) info.resumeReason = meta.resumeReason;
  if (meta.lostInterval) info.lostInterval = { from: new Date(meta.lostInterval.from), to: new Date(meta.lostInterval.to) };
  if (meta.timeoutMs) info.timeoutMs = meta.timeoutMs;
  if (meta.onTimeout) info.onTimeout = meta.onTimeout;
  return info;
}
