// Sandbox.create's start, once its options and the host were checked: its directory with the
// owner lock taken -> meta.json ('starting') -> the warm template for its settings restored into
// it (template-start.ts; a user template's build when the machine matches) or, without one, a
// cold boot of the root filesystem under the sandbox's first overlay -> a larger disk grown ->
// meta.json ('running'). A failure undoes all of it, newest first: the guest, the directory,
// the lock.
import { stat } from 'node:fs/promises';

import { resolveNetwork, type ResolvedNetwork } from '../net/options.js';
import { SandboxNetwork } from '../net/sandbox-network.js';
import { takeOwnerLock, type OwnerLock } from '../store/owner-lock.js';
import { SandboxDir, newSandboxId, type SandboxMeta } from '../store/sandbox-dir.js';
import type { TemplateRecord } from '../template/record.js';
import { DEFAULT_CPU, DEFAULT_MEMORY_MB, type ResourcesOpts } from '../template/resources.js';
import { GuestRun } from './guest-run.js';
import { growRootFs } from './guest-requests.js';
import { sandboxIdentity } from './identity.js';
import { SANDBOX_BUSY } from './live.js';
import { GUEST_CMDLINE, guestMachineOptions } from './readiness.js';
import type { Running } from './resume.js';
import type { SandboxOpts } from './sandbox.js';
import { startFromTemplate, startFromUserTemplate, type Started } from './template-start.js';
import type { TemplateInputs } from './template.js';
import { UndoStack } from './undo-stack.js';

const MIB = 1048576;

/** What a create starts from: the template (`user`: its record, null for 'base'), the sizes asked
 *  (mergeResourceAliases), and the kernel and root filesystem resolved for it. */
export interface CreateSources {
  template: string;
  user: TemplateRecord | null;
  sizes: ResourcesOpts;
  artifacts: { kernel: string; rootfs: string };
}

/** Starts a new sandbox (its options checked): its directory, its owner lock and its running guest. */
export async function startSandbox(opts: SandboxOpts, from: CreateSources): Promise<NewSandbox> {
  const { template, user, sizes, artifacts } = from;
  const useTemplate = opts.template !== false;
  const templateDiskMb = user?.resources.diskMb ?? Math.floor((await stat(artifacts.rootfs)).size / MIB);
  // A larger disk than the template's grows on the way (the restored machine's disk, then its
  // ext4 online, in the guest); a smaller one is the template's (ext4 does not shrink online).
  const growBytes = sizes.diskMb !== undefined && sizes.diskMb > templateDiskMb ? sizes.diskMb * MIB : undefined;
  const diskMb = growBytes !== undefined ? sizes.diskMb! : templateDiskMb;
  const dir = new SandboxDir(newSandboxId());
  const netOpts = resolveNetwork('opts.network', opts.network);
  const netMachine = netOpts ? SandboxNetwork.machineOptions(dir.id) : undefined;
  const meta: SandboxMeta = {
    id: dir.id,
    template,
    createdAt: new Date().toISOString(),
    vcpus: sizes.cpu ?? user?.resources.cpu ?? DEFAULT_CPU,
    memoryMiB: sizes.memoryMb ?? user?.resources.memoryMb ?? DEFAULT_MEMORY_MB,
    metadata: opts.metadata ?? {},
    envs: { ...(user?.defaults.envs ?? {}), ...(opts.envs ?? {}) },
    kernel: artifacts.kernel,
    rootfs: user?.build.rootfs ?? artifacts.rootfs,
    cmdline: [GUEST_CMDLINE, opts.boot?.cmdlineExtra, netMachine?.cmdline].filter(Boolean).join(' '),
    diskMb,
    ...(user ? { defaults: { user: user.defaults.user, cwd: user.defaults.cwd }, templateLayers: user.build.diskLayers } : {}),
    ownerPid: process.pid,
    state: 'starting',
    ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs, onTimeout: opts.lifecycle?.onTimeout ?? 'kill' } : {}),
    ...(opts.lifecycle?.autoResume ? { autoResume: true } : {}),
    ...(netOpts ? { network: netOpts } : {}),
  };

  const bootMs = opts.boot?.timeoutMs ?? 30_000;
  const inputs: TemplateInputs = {
    name: template,
    kernel: meta.kernel,
    rootfs: meta.rootfs,
    cmdline: meta.cmdline,
    vcpus: meta.vcpus,
    memoryMiB: meta.memoryMiB,
    net: netOpts !== false,
  };

  let bootReason = 'template: false';
  return startInNewDir(
    dir,
    meta,
    async () => {
      if (useTemplate) {
        const r = user
          ? await startFromUserTemplate(user, meta, dir, netOpts, bootMs, growBytes)
          : await startFromTemplate(inputs, dir, netOpts, { bootMs, agentMs: bootMs }, growBytes);
        if ('started' in r) return r.started;
        bootReason = r.reason;
      }
      return coldBoot(dir, meta, netOpts, netMachine?.net, bootMs, growBytes);
    },
    async (started) => {
      // The disk is larger than the filesystem on it: grow it before anyone writes (returns once
      // `df /` shows the size). Restored or booted alike.
      if (growBytes !== undefined) await growRootFs(started.guest.client, growBytes);
      return started.template
        ? { createdFrom: 'template' as const, templateBuild: started.template.dir, diskLayers: started.diskLayers }
        : { createdFrom: 'boot' as const, bootReason };
    },
  );
}

/** A sandbox just started: its directory, meta.json as written, and its run. */
export interface NewSandbox {
  dir: SandboxDir;
  meta: SandboxMeta;
  run: Running;
}

/**
 * Takes a new sandbox from nothing to running (create and each child of a fork): its directory
 * opened (openSandboxDir), its guest started by `start`, then `finish` (work on the running
 * guest; the meta.json fields it returns), and the running meta.json written. A failure
 * anywhere stops the guest and removes the directory. `starting: false` leaves out the
 * 'starting' meta.json (a fork's child, whose start takes milliseconds: until its one meta.json
 * lands, its directory is an interrupted create's to `torpor prune`, and a fork base stays
 * while any directory's meta.json cannot be read).
 */
export async function startInNewDir(
  dir: SandboxDir,
  meta: SandboxMeta,
  start: () => Promise<Started>,
  finish: (started: Started) => Promise<Partial<SandboxMeta>>,
  opts: { starting?: boolean } = {},
): Promise<NewSandbox> {
  const undo = new UndoStack();
  try {
    const lock = await openSandboxDir(dir, opts.starting === false ? null : meta, undo);
    const started = await start();
    const { guest } = started;
    undo.defer(() => guest.stop());
    const running: SandboxMeta = {
      ...meta,
      state: 'running',
      ...(guest.network ? { hostPorts: guest.network.hostPortsRecord() } : {}),
      ...(await finish(started)),
    };
    await dir.writeMeta(running);
    undo.move();
    return { dir, meta: running, run: { guest, lock, diskLayers: started.diskLayers } };
  } catch (err) {
    await undo.disposeAsync().catch(() => undefined);
    throw err;
  }
}

/**
 * A new sandbox's directory, its owner lock taken and its meta.json written (`meta`; null: none
 * yet). `undo` removes the directory and then lets the lock go (deferred first, so undone last).
 */
export async function openSandboxDir(dir: SandboxDir, meta: SandboxMeta | null, undo: UndoStack): Promise<OwnerLock> {
  await dir.create();
  let lock: OwnerLock | undefined;
  undo.defer(async () => {
    try {
      await dir.remove();
    } finally {
      await lock?.release();
    }
  });
  const taken = await takeOwnerLock(dir.lockPath);
  if (!taken.ok) throw SANDBOX_BUSY(dir.id, taken.ownerPid); // a fresh random id: cannot happen
  lock = taken.lock;
  if (meta) await dir.writeMeta(meta);
  return lock;
}

/**
 * A cold boot (template: false, or no template could be used): the root filesystem under the
 * sandbox's first overlay (over a user template's layers), the agent's knock.
 */
async function coldBoot(
  dir: SandboxDir,
  meta: SandboxMeta,
  netOpts: ResolvedNetwork | false,
  net: { mac: string } | undefined,
  bootMs: number,
  growBytes?: number,
): Promise<Started> {
  const disk = {
    base: meta.rootfs,
    overlay: dir.firstOverlay,
    ...(meta.templateLayers?.length ? { frozen: meta.templateLayers } : {}),
    ...(growBytes !== undefined ? { sizeBytes: growBytes } : {}),
  };
  const options = guestMachineOptions(meta, disk, { consoleLog: dir.consoleLog, ...(net ? { net } : {}) });
  const guest = await GuestRun.boot(options, { network: netOpts, agentTimeoutMs: bootMs, identity: sandboxIdentity(dir.id) });
  return { guest, diskLayers: [...(meta.templateLayers ?? [])] };
}
