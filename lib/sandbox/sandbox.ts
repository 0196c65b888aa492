// Sandbox: a Linux microVM whose guest agent runs commands and moves files, and that can be
// paused into its directory and continued later, in this process or in another one.
//
//   await using sbx = await Sandbox.create()
//   const r = await sbx.commands.run(['python3', '-c', 'print(6*7)'])
//   await sbx.pause()                                   // RAM, processes, files: into its directory
//   const again = await Sandbox.connect(sbx.sandboxId)  // hours later, from any process
//
// create(): validate options -> check this host can boot a Linux guest -> ensureArtifacts()
// (kernel, root filesystem with the agent as /usr/sbin/torpor-agent) -> its directory
// (lib/store/sandbox-dir.ts) with the owner lock taken -> the warm template for its settings
// restored into it (template-start.ts; the first create boots and captures the template) ->
// RESUMED. Without a template (template: false, or one that cannot be used): a Machine with the
// root filesystem as /dev/vda -> the agent's knock on vsock port 1023 (readiness.ts) -> vsock
// port 1024 -> HELLO.
// pause() / connect(): docs/sandbox-lifecycle.md. States and transitions: lifecycle.ts.
import { existsSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';

import { InvalidArgumentError, KvmUnavailableError, SandboxNotFoundError, TemplateNotFoundError, TorporError } from '../errors.js';
import type { AgentClient } from '../agent/client.js';
import { homeLayout, torporHome } from '../store/home.js';
import { dropUnreferencedLayers, frozenDiskTop, generationDiskLayers, metaLayerPath } from '../store/generations.js';
import { takeOwnerLock, type OwnerLock } from '../store/owner-lock.js';
import {
  SandboxDir,
  checkSandboxId,
  newSandboxId,
  sandboxIds,
  type OnTimeout,
  type SandboxMeta,
} from '../store/sandbox-dir.js';
import { checkKernelFile } from '../setup/kernel-format.js';
import { Machine } from '../vm/machine.js';
import { type NetworkOptions, type ResolvedNetwork, resolveNetwork } from '../net/options.js';
import { SandboxNetwork } from '../net/sandbox-network.js';
import { createAgentApi } from './agent-api.js';
import { growRootFs, syncGuest } from './guest-requests.js';
import { infoOf, type SandboxInfo } from './info.js';
import { IdleTimer } from './idle-timer.js';
import { Lifecycle, SANDBOX_STATES, isSandboxState, type SandboxState } from './lifecycle.js';
import { installSignalHandlers, registerRunning, unregisterRunning } from './process-exit.js';
import { GUEST_CID, awaitBootedAgent, awaitRestoredAgent, guestMachineOptions } from './readiness.js';
import { resume, type ConnectOpts, type Running } from './resume.js';
import { restoreInto, startFromTemplate, type Started } from './template-start.js';
import type { TemplateInputs } from './template.js';
export type { ConnectOpts } from './resume.js';
export type { SandboxInfo } from './info.js';
export { GUEST_CID };
export type { SandboxState } from './lifecycle.js';
import type { CommandDefaults, Commands } from './commands.js';
import type { Files } from './files.js';
import type { Pty } from './pty.js';
import { checkEnvs, checkInt, checkKnownKeys, checkObject, checkString, fail } from './validate.js';
import { readTemplateRecord, type TemplateRecord } from '../template/record.js';
import { checkResources, mergeResourceAliases, DEFAULT_CPU, DEFAULT_MEMORY_MB, type ResourcesOpts } from '../template/resources.js';
import { parseImageUser } from '../template/user.js';

const MIB = 1048576;

export interface SandboxOpts {
  /**
   * Template name: 'base' (default), or one made with Template.build (docs/templates.md). The
   * sandbox continues from the warm template for its settings (kernel, root filesystem, command line, vCPUs, memory, network
   * device or not), which the first create with those settings boots and captures once
   * (docs/sandbox-lifecycle.md, "Templates"). false: boot the guest instead (a cold boot).
   */
  template?: string | false;
  /**
   * The machine's size: vCPUs, RAM (MiB) and root disk (MiB). Default: the template's (2 vCPUs,
   * 512 MiB for 'base'). A sandbox with a template's size continues the template's machine; another
   * cpu or memoryMb boots the template's disk instead. diskMb larger than the template's grows the
   * sandbox's disk, still from the warm template: the restored machine gets the larger disk and
   * its root ext4 is grown online before create returns (`df /` shows it; docs/templates.md).
   * diskMb smaller than the template's is the template's (ext4 does not shrink online).
   */
  resources?: ResourcesOpts;
  /** Alias of resources.cpu. */
  vcpus?: number;
  /** Alias of resources.memoryMb. */
  memoryMiB?: number;
  /** Environment every command of this sandbox gets (a command's own envs win). */
  envs?: Record<string, string>;
  /** Your own labels, stored in meta.json. */
  metadata?: Record<string, string>;
  /** How the guest boots. */
  boot?: {
    /** Guest kernel instead of the stored one (default: $TORPOR_KERNEL, then setup's). */
    kernel?: string;
    /** Appended to the kernel command line. */
    cmdlineExtra?: string;
    /** How long to wait for the agent to knock and answer (default 30 s; a PVM host is slower). */
    timeoutMs?: number;
  };
  /** After this long without activity (API calls, command output), `lifecycle.onTimeout`
   *  happens (default: never). Kept across pause and connect. */
  timeoutMs?: number;
  lifecycle?: {
    /** What the timeout does: 'kill' (default) or 'pause' (a paused sandbox costs disk only). */
    onTimeout?: OnTimeout;
  };
  /** The guest's network (lib/net/options.ts): egress on, host loopback off by default; false: no
   *  network device. Kept across pause and connect (a fresh backend each run: docs/network.md). */
  network?: NetworkOptions | false;
}


export interface PauseResult {
  sandboxId: string;
  generation: number;
  /** Bytes the generation wrote. */
  bytes: number;
  /** Machine state and memory read (ms from the capture's start), and the generation durable. */
  capturedMs: number;
  durableMs: number;
  pausedAt: Date;
}


/** Sandbox.list's filters. */
export interface ListOpts {
  state?: SandboxState | SandboxState[];
  /** Only sandboxes whose metadata has every one of these keys with these values. */
  metadata?: Record<string, string>;
}

export const GUEST_CMDLINE =
  'console=ttyS0 reboot=k panic=1 pci=off nomodule 8250.nr_uarts=1 i8042.noaux i8042.nomux i8042.dumbkbd ' +
  'acpi=off root=/dev/vda rw rootflags=noinit_itable init=/usr/sbin/torpor-agent quiet';
export { AGENT_KNOCK_PORT, AGENT_VSOCK_PORT, awaitBootedAgent, awaitRestoredAgent } from './readiness.js';

const OPT_KEYS = ['template', 'resources', 'vcpus', 'memoryMiB', 'envs', 'metadata', 'boot', 'timeoutMs', 'lifecycle', 'network'] as const;
/** How long the guest has to answer SYNC before a pause captures without it. */
const SYNC_TIMEOUT_MS = 10_000;
/** How long the capture of an ending process waits for the vCPUs to park. */
const EXIT_CAPTURE_TIMEOUT_MS = 2_000;

function validate(opts: SandboxOpts): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, OPT_KEYS);
  if (opts.template !== false) checkString('opts.template', opts.template, { nonEmpty: true });
  checkResources('opts.resources', opts.resources);
  checkInt('opts.vcpus', opts.vcpus, 1, 64);
  checkInt('opts.memoryMiB', opts.memoryMiB, 64, 256 * 1024);
  checkEnvs('opts.envs', opts.envs);
  checkEnvs('opts.metadata', opts.metadata);
  checkInt('opts.timeoutMs', opts.timeoutMs, 1, 2 ** 31 - 1);
  checkObject('opts.lifecycle', opts.lifecycle);
  checkKnownKeys('opts.lifecycle', opts.lifecycle, ['onTimeout']);
  const onTimeout = opts.lifecycle?.onTimeout;
  if (onTimeout !== undefined && onTimeout !== 'pause' && onTimeout !== 'kill') fail('opts.lifecycle.onTimeout', "'pause' or 'kill'", onTimeout);
  checkObject('opts.boot', opts.boot);
  checkKnownKeys('opts.boot', opts.boot, ['kernel', 'cmdlineExtra', 'timeoutMs']);
  checkString('opts.boot.kernel', opts.boot?.kernel, { nonEmpty: true });
  checkString('opts.boot.cmdlineExtra', opts.boot?.cmdlineExtra);
  checkInt('opts.boot.timeoutMs', opts.boot?.timeoutMs, 1, 2 ** 31 - 1);
  if (opts.boot?.kernel !== undefined && !existsSync(opts.boot.kernel)) fail('opts.boot.kernel', 'an existing file', opts.boot.kernel);
  resolveNetwork('opts.network', opts.network);
}

function validateConnect(opts: ConnectOpts): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, ['onResume', 'restoreTimeoutMs', 'bootTimeoutMs']);
  if (opts.onResume !== undefined && opts.onResume !== 'restore' && opts.onResume !== 'reboot') fail('opts.onResume', "'restore' or 'reboot'", opts.onResume);
  checkInt('opts.restoreTimeoutMs', opts.restoreTimeoutMs, 1, 2 ** 31 - 1);
  checkInt('opts.bootTimeoutMs', opts.bootTimeoutMs, 1, 2 ** 31 - 1);
}

/** Whether this host can boot a Linux guest, and if not, exactly why and what to do. */
export async function linuxGuestSupport(kernelOverride?: string): Promise<{ ok: true } | { ok: false; reason: string }> {
  const { detectHost } = await import('../setup/host.js');
  const host = await detectHost();
  if (!host.kvm) {
    return { ok: false, reason: '/dev/kvm does not exist: this host has no KVM. Run torpor on a Linux host with KVM enabled (`torpor doctor` says what is missing).' };
  }
  if (host.kind === 'pvm' && !kernelOverride && !process.env.TORPOR_KERNEL && !(await recordedKernel())) {
    const { PVM_KERNEL_NOTE } = await import('../setup/artifacts.js');
    return { ok: false, reason: PVM_KERNEL_NOTE };
  }
  return { ok: true };
}

async function recordedKernel(): Promise<boolean> {
  try {
    const record = JSON.parse(await readFile(homeLayout(torporHome()).setupRecord, 'utf8')) as { kernel?: { source?: string } };
    return typeof record.kernel?.source === 'string';
  } catch {
    return false;
  }
}



const SANDBOX_BUSY = (id: string, pid: number | null) =>
  new TorporError(
    'SANDBOX_BUSY',
    `sandbox ${id} is in use by ${pid ? `process ${pid}` : 'another process'}: pause it there (or end that process), then connect again`,
  );

export class Sandbox implements AsyncDisposable {
  readonly sandboxId: string;
  readonly commands: Commands;
  readonly files: Files;
  readonly pty: Pty;
  /** The sandbox's directory (tests and diagnostics read it; the API does not expose it). */
  private readonly dir: string;
  readonly #dir: SandboxDir;
  #meta: SandboxMeta;
  #run: Running | null;
  readonly #life: Lifecycle;
  #idle: IdleTimer | undefined;
  /** Foreground commands.run calls in flight: a pause lets them finish first. */
  readonly #foreground = new Set<Promise<unknown>>();
  /** Requests the sandbox itself sends while pausing (SYNC). */
  #internal = false;
  /** The pause in progress: connect and kill in this process wait for it. */
  #pausing: Promise<PauseResult> | null = null;

  private constructor(dir: SandboxDir, meta: SandboxMeta, run: Running) {
    this.sandboxId = dir.id;
    this.dir = dir.path;
    this.#dir = dir;
    this.#meta = meta;
    this.#run = run;
    this.#life = new Lifecycle('running', `sandbox ${dir.id}`);
    const api = createAgentApi(() => this.client, commandDefaultsOf(meta));
    this.commands = api.commands;
    this.files = api.files;
    this.pty = api.pty;
    const run_ = api.commands.run.bind(api.commands) as (...a: unknown[]) => Promise<unknown>;
    // Foreground runs are tracked so that a pause waits for them (docs/sandbox-lifecycle.md).
    (api.commands as { run: unknown }).run = (cmd: unknown, opts?: { background?: boolean }) => {
      const p = run_(cmd, opts);
      if (opts?.background) return p;
      this.#foreground.add(p);
      const done = () => this.#foreground.delete(p);
      p.then(done, done);
      return p;
    };
    this.#adopt(run);
    this.#armTimeout();
    registerRunning(this);
    live.set(dir.id, this);
  }

  /** Alias of sandboxId. */
  get id(): string {
    return this.sandboxId;
  }

  /** The sandbox's state in this process: running, pausing, paused, resuming, killed or failed. */
  get state(): SandboxState {
    return this.#life.state;
  }

  isRunning(): boolean {
    return this.#life.state === 'running';
  }

  /** The running machine (tests and diagnostics read it; the API does not expose it). */
  private get machine(): Machine {
    if (!this.#run) throw this.#notRunning('the machine');
    return this.#run.machine;
  }

  private get client(): AgentClient {
    if (!this.#run) throw this.#notRunning('this request');
    return this.#run.client;
  }

  #notRunning(what: string): TorporError {
    try {
      this.#life.require(what, 'running');
    } catch (err) {
      return err as TorporError;
    }
    return new TorporError('INVALID_STATE', `${what}: sandbox ${this.sandboxId} has no machine`);
  }

  /** Hooks a new machine and client into the sandbox: activity, and the guest ending by itself. */
  #adopt(run: Running): void {
    const { client, machine } = run;
    // A worker thread that ends with this sandbox running (no JS runs there): the addon's cleanup
    // hook captures it into the next generation; connect finds it newer than meta.json says.
    machine.captureOnTeardown(this.#dir.snapshots, EXIT_CAPTURE_TIMEOUT_MS);
    // An idle session does not keep the process alive: Node reaches beforeExit, which pauses.
    client.setIdleUnref(true);
    const open = client.open.bind(client);
    client.open = (type, fields, handler, opts) => {
      if (this.#life.state !== 'running' && !this.#internal) this.#life.require('a request to the agent', 'running');
      this.#idle?.touch();
      return open(
        type,
        fields,
        {
          onFrame: (...a) => {
            this.#idle?.touch();
            handler.onFrame(...a);
          },
          onError: (err) => handler.onError(err),
          ...(handler.reissue ? { reissue: () => handler.reissue!() } : {}),
        },
        opts,
      );
    };
    // A guest that stops by itself (panic, reset, poweroff) takes the agent with it: end the
    // session now rather than letting requests wait for reconnects that cannot succeed.
    // The requests it fails say why the machine ended (a guest panic's last console line).
    machine.once('exit', (state, reason) => {
      if (this.#run?.machine !== machine || this.#life.state !== 'running') return;
      const last = reason.consoleTail.trimEnd().split('\n').slice(-1)[0] ?? '';
      void client.close(`the sandbox's machine ended (${state}, ${reason.kind}: ${reason.message}); console: ${last.slice(-200)}`);
      void run.network?.stop().catch(() => undefined);
      this.#idle?.stop();
      this.#life.to('failed');
      unregisterRunning(this);
    });
  }

  #armTimeout(): void {
    this.#idle?.stop();
    this.#idle = undefined;
    const ms = this.#meta.timeoutMs;
    if (!ms) return;
    this.#idle = new IdleTimer(ms, () => {
      if (this.#life.state !== 'running') return;
      const act = this.#meta.onTimeout === 'pause' ? this.pause() : this.kill();
      act.catch(() => undefined);
    });
    this.#idle.start();
  }

  static async create(opts: SandboxOpts = {}): Promise<Sandbox> {
    validate(opts);
    const useTemplate = opts.template !== false;
    const template = typeof opts.template === 'string' ? opts.template : 'base';
    const sizes = mergeResourceAliases(opts.resources, opts.vcpus, opts.memoryMiB);
    const user: TemplateRecord | null = template === 'base' ? null : await readTemplateRecord(template);
    if (template !== 'base' && !user) {
      throw new TemplateNotFoundError(`no template named ${JSON.stringify(template)}: 'base', or one built with Template.build (Template.list() names them)`);
    }
    // The order of refusals: the caller's options first (above, and a supplied kernel that is no
    // regular file), then the host (KVM_UNAVAILABLE), then the kernel's contents, read and
    // classified while the artifacts are resolved (KERNEL_INVALID). So a wrong option is named
    // as such on every host, with or without /dev/kvm.
    if (opts.boot?.kernel !== undefined) await checkKernelFile(opts.boot.kernel);
    const support = await linuxGuestSupport(opts.boot?.kernel);
    if (!support.ok) throw new KvmUnavailableError(`cannot start a Linux sandbox on this host: ${support.reason}`);

    const artifacts = await sharedArtifacts(opts.boot?.kernel);
    if (!artifacts.linuxBootable) {
      throw new KvmUnavailableError(`cannot start a Linux sandbox on this host: ${artifacts.notes.join(' ')}`);
    }

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

    // Every failure from here on stops what was started and removes the sandbox's directory.
    let lock: OwnerLock | undefined;
    let started: Started | undefined;
    try {
      await dir.create();
      const taken = await takeOwnerLock(dir.lockPath);
      if (!taken.ok) throw SANDBOX_BUSY(dir.id, taken.ownerPid); // a fresh random id: cannot happen
      lock = taken.lock;
      await dir.writeMeta(meta);
      let bootReason = "template: false";
      if (useTemplate && user) {
        const r = await startFromUserTemplate(user, meta, dir, netOpts, bootMs, growBytes);
        if ('started' in r) started = r.started;
        else bootReason = r.reason;
      } else if (useTemplate) {
        const r = await startFromTemplate(inputs, dir, netOpts, { bootMs, agentMs: bootMs }, growBytes);
        if ('started' in r) started = r.started;
        else bootReason = r.reason;
      }
      started ??= await bootMachine(dir, meta, netOpts, netMachine?.net, bootMs, growBytes);
      const { machine, client, network } = started;
      // The disk is larger than the filesystem on it: grow it before anyone writes (returns once
      // `df /` shows the size). Restored or booted alike.
      if (growBytes !== undefined) await growRootFs(client, growBytes);
      const running: SandboxMeta = {
        ...meta,
        state: 'running',
        ...(network ? { hostPorts: network.hostPortsRecord() } : {}),
        ...(started.template
          ? { createdFrom: 'template' as const, templateBuild: started.template.dir, diskLayers: started.diskLayers }
          : { createdFrom: 'boot' as const, bootReason }),
      };
      await dir.writeMeta(running);
      return new Sandbox(dir, running, { machine, client, lock, diskLayers: started.diskLayers, ...(network ? { network } : {}) });
    } catch (err) {
      // The client first: with reconnect on, a client left open would keep dialling a stopped machine.
      await started?.client.close().catch(() => undefined);
      await started?.machine.stop().catch(() => undefined);
      await started?.network?.stop().catch(() => undefined);
      await dir.remove().catch(() => undefined);
      await lock?.release().catch(() => undefined);
      throw err;
    }
  }

  /**
   * Freezes the sandbox into its directory and gives back its CPU and memory: foreground
   * `commands.run` calls in flight finish first (new requests are refused meanwhile), the agent
   * runs `sync`, the machine is captured durably (a full memory image the first time, the pages
   * written since after that) and stopped, the owner lock is released. The sandbox is then
   * `paused`: `Sandbox.connect(sandboxId)` continues it, from this process or another.
   */
  pause(): Promise<PauseResult> {
    try {
      this.#life.require('pause()', 'running');
    } catch (err) {
      return Promise.reject(err);
    }
    const p = this.#pauseNow();
    this.#pausing = p;
    const clear = () => {
      if (this.#pausing === p) this.#pausing = null;
    };
    p.then(clear, clear);
    return p;
  }

  async #pauseNow(): Promise<PauseResult> {
    const run = this.#run!;
    this.#life.to('pausing');
    run.machine.captureOnTeardown(null);
    this.#idle?.stop();
    // Captured while the guest still ran would be fine for memory, but the output of a command
    // finishing during the capture would reach nobody: let them end first.
    await Promise.allSettled([...this.#foreground]);
    this.#internal = true;
    try {
      await syncGuest(run.client, SYNC_TIMEOUT_MS);
    } catch {
      // A guest whose agent does not answer is captured anyway: memory and disk taken at one
      // instant are consistent; only a boot from this generation's disk would miss unsynced data.
    } finally {
      this.#internal = false;
    }
    const pausedAt = new Date();
    await run.client.close();
    if (!existsSync(this.#dir.metaPath)) {
      // The directory was removed under a running sandbox (a test's temporary home): a capture
      // would recreate it. The sandbox ends instead.
      await run.machine.stop().catch(() => undefined);
      await run.network?.stop().catch(() => undefined);
      this.#run = null;
      unregisterRunning(this);
      await run.lock.release();
      this.#life.to('failed');
      throw new SandboxNotFoundError(`sandbox ${this.sandboxId}: its directory ${this.dir} was removed; nothing to pause into`);
    }
    let snap;
    try {
      snap = await run.machine.snapshot(this.#dir.snapshots, { stop: true });
    } catch (err) {
      await this.#captureFailed(run, err);
      throw err;
    }
    // The machine is stopped and captured: its backend ends, and every host-side flow with it
    // (open network connections are closed on pause; docs/network.md).
    await run.network?.stop().catch(() => undefined);
    // The disk as the generation names it: the addon may have merged older layers into one.
    const diskLayers = snap.diskLayers[0]?.map((p) => metaLayerPath(this.#dir, p)) ?? [...run.diskLayers, frozenDiskTop(snap.generation)];
    this.#meta = {
      ...this.#meta,
      state: 'paused',
      ownerPid: null,
      generation: snap.generation,
      pausedAt: pausedAt.toISOString(),
      diskLayers,
    };
    try {
      await this.#dir.writeMeta(this.#meta);
      await this.#dir.dropUnusedTops(diskLayers).catch(() => undefined);
      // meta.json is durable: what this generation no longer names goes.
      await dropUnreferencedLayers(this.#dir, diskLayers).catch(() => undefined);
      // meta.json writes a killed owner left half done.
      await this.#dir.dropStaleMetaTemps().catch(() => undefined);
    } finally {
      this.#run = null;
      unregisterRunning(this);
      await run.lock.release();
      this.#life.to('paused');
    }
    return {
      sandboxId: this.sandboxId,
      generation: snap.generation,
      bytes: snap.bytes,
      capturedMs: snap.capturedMs,
      durableMs: snap.durableMs,
      pausedAt,
    };
  }

  /** The process is ending (an `exit` handler): capture now, synchronously, and record the
   *  sandbox as paused. Best effort: a failure leaves it as a dead owner's (connect restores the
   *  last generation). The lock dies with the process. */
  captureOnExit(): void {
    const run = this.#run;
    // A directory removed under a running sandbox (a test's temporary home) is not recreated.
    if (!run || this.#life.state !== 'running' || !existsSync(this.#dir.metaPath)) return;
    try {
      run.machine.captureOnTeardown(null);
      const pausedAt = new Date();
      const generation = run.machine.captureNow(this.#dir.snapshots, EXIT_CAPTURE_TIMEOUT_MS);
      const diskLayers = generationDiskLayers(this.#dir, generation) ?? [...run.diskLayers, frozenDiskTop(generation)];
      this.#meta = { ...this.#meta, state: 'paused', ownerPid: null, generation, pausedAt: pausedAt.toISOString(), diskLayers };
      this.#dir.writeMetaSync(this.#meta);
      this.#life.to('pausing');
      this.#life.to('paused');
    } catch {
      // left as it was: recovered by the next connect
    }
  }

  /** A capture that failed: a machine that still runs goes on (with a new client); one that
   *  stopped leaves the sandbox `failed`, its directory as the last generation left it. */
  async #captureFailed(run: Running, err: unknown): Promise<void> {
    const st = run.machine.state;
    if (st === 'running' || st === 'paused') {
      try {
        if (st === 'paused') await run.machine.resume();
        const client = await awaitRestoredAgent(run.machine, 10_000);
        this.#run = { ...run, client };
        this.#adopt(this.#run);
        this.#life.to('running');
        this.#armTimeout();
        return;
      } catch {
        // fall through: stop it
      }
    }
    await run.machine.stop().catch(() => undefined);
    await run.network?.stop().catch(() => undefined);
    this.#run = null;
    unregisterRunning(this);
    await run.lock.release().catch(() => undefined);
    this.#life.to('failed');
    void err;
  }

  /**
   * Continues a sandbox: the one this process runs (returned as it is), or a paused one, or one
   * whose owner died (recovered from its last generation; getInfo().lostInterval says since
   * when work is lost). SANDBOX_NOT_FOUND when there is no such sandbox, SANDBOX_BUSY (naming
   * the pid) when another live process runs it. From memory by default: the restored guest's
   * agent gets RESUMED (host clock, fresh entropy) before anything else; when the memory image
   * cannot be used, the same generation's disk boots instead (`resumedFrom: 'disk'`, the reason
   * in `resumeReason`).
   */
  static async connect(sandboxId: string, opts: ConnectOpts = {}): Promise<Sandbox> {
    checkSandboxId(sandboxId);
    validateConnect(opts);
    const mine = live.get(sandboxId);
    if (mine && mine.#pausing) await mine.#pausing.catch(() => undefined);
    if (mine && mine.#life.state === 'running') return mine;
    if (mine && mine.#run) {
      // This process holds it, in a state connect cannot continue (its guest ended by itself).
      throw new TorporError('INVALID_STATE', `sandbox ${sandboxId} is ${mine.#life.state} in this process (its guest ended); kill() it, or connect to another one`);
    }
    const dir = new SandboxDir(sandboxId);
    if (!(await dir.exists())) throw new SandboxNotFoundError(`no sandbox ${sandboxId} in ${dir.path} (Sandbox.list() shows the ones there are)`);
    const taken = await takeOwnerLock(dir.lockPath).catch(async (err: unknown) => {
      if (!(await dir.exists())) throw new SandboxNotFoundError(`sandbox ${sandboxId} was removed`, { cause: err });
      throw err;
    });
    if (!taken.ok) throw SANDBOX_BUSY(sandboxId, taken.ownerPid);
    const lock = taken.lock;
    try {
      const { meta, run } = await resume(dir, await dir.readMeta(), lock, opts);
      return new Sandbox(dir, meta, run);
    } catch (err) {
      await lock.release().catch(() => undefined);
      throw err;
    }
  }

  /** The sandboxes under TORPOR_HOME, optionally only those in `state`. */
  /** The sandboxes under TORPOR_HOME, optionally only those in a state (or states) and with
   *  the given metadata; `{ query: { state, metadata } }` (E2B's shape) works too. */
  static async list(opts: ListOpts & { query?: ListOpts } = {}): Promise<SandboxInfo[]> {
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, ['state', 'metadata', 'query']);
    const query: ListOpts | undefined = opts.query;
    checkObject('opts.query', query as unknown);
    checkKnownKeys('opts.query', query, ['state', 'metadata']);
    const state = opts.state ?? query?.state;
    const metadata = opts.metadata ?? query?.metadata;
    checkEnvs('opts.metadata', metadata);
    const want = state === undefined ? null : Array.isArray(state) ? state : [state];
    for (const s of want ?? []) if (!isSandboxState(s)) fail('opts.state', `one of ${SANDBOX_STATES.join(', ')}`, s);
    const out: SandboxInfo[] = [];
    for (const id of await sandboxIds()) {
      const info = await Sandbox.getInfo(id).catch(() => null);
      if (!info || (want && !want.includes(info.state))) continue;
      if (metadata && !Object.entries(metadata).every(([k, v]) => info.metadata[k] === v)) continue;
      out.push(info);
    }
    return out;
  }

  /**
   * Sets the lifecycle timeout from now on (E2B's setTimeout): `timeoutMs` without activity, then
   * `lifecycle.onTimeout`; 0 turns it off. Kept in meta.json, so it survives pause and connect.
   */
  async setTimeout(timeoutMs: number, opts: { onTimeout?: OnTimeout } = {}): Promise<void> {
    checkInt('timeoutMs', timeoutMs, 0, 2 ** 31 - 1);
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, ['onTimeout']);
    if (opts.onTimeout !== undefined && opts.onTimeout !== 'pause' && opts.onTimeout !== 'kill') fail('opts.onTimeout', "'pause' or 'kill'", opts.onTimeout);
    this.#life.require('setTimeout()', 'running');
    const meta = { ...this.#meta };
    delete meta.timeoutMs;
    delete meta.onTimeout;
    if (timeoutMs > 0) {
      meta.timeoutMs = timeoutMs;
      meta.onTimeout = opts.onTimeout ?? this.#meta.onTimeout ?? 'kill';
    }
    await this.#dir.writeMeta(meta);
    this.#meta = meta;
    this.#armTimeout();
  }

  /** What a sandbox is and where it stands, from its directory (any process may ask). */
  static async getInfo(sandboxId: string): Promise<SandboxInfo> {
    checkSandboxId(sandboxId);
    const mine = live.get(sandboxId);
    if (mine && mine.#run) return mine.getInfo();
    const dir = new SandboxDir(sandboxId);
    const meta = await dir.readMeta();
    let state = meta.state;
    let ownerPid: number | null = null;
    if (state !== 'paused' && state !== 'killed') {
      // Recorded as live: is its owner? A free lock means the owner died; connect recovers it.
      const probe = await takeOwnerLock(dir.lockPath);
      if (probe.ok) {
        await probe.lock.release();
        state = 'paused';
      } else {
        ownerPid = probe.ownerPid;
      }
    }
    return infoOf(meta, state, ownerPid, await dir.currentGeneration(), await dir.bytesOnDisk());
  }

  /** This sandbox's info (state as this process knows it). */
  async getInfo(): Promise<SandboxInfo> {
    const running = this.#run !== null;
    return infoOf(this.#meta, this.#life.state, running ? process.pid : null, this.#meta.generation ?? 0, await this.#dir.bytesOnDisk());
  }

  /**
   * Removes a sandbox that no live process runs (paused, or its owner dead): its files are
   * deleted. SANDBOX_BUSY when a live process owns it (kill it there). Resolves false when there
   * was no such sandbox.
   */
  static async kill(sandboxId: string): Promise<boolean> {
    checkSandboxId(sandboxId);
    const mine = live.get(sandboxId);
    if (mine && mine.#run) {
      await mine.kill();
      return true;
    }
    const dir = new SandboxDir(sandboxId);
    if (!(await dir.exists())) return false;
    const taken = await takeOwnerLock(dir.lockPath).catch(async (err: unknown) => {
      if (!(await dir.exists())) return null;
      throw err;
    });
    if (taken === null) return false;
    if (!taken.ok) throw SANDBOX_BUSY(sandboxId, taken.ownerPid);
    try {
      await dir.remove();
    } finally {
      await taken.lock.release();
    }
    if (mine) mine.#markKilled();
    return true;
  }

  #markKilled(): void {
    if (this.#life.state !== 'killed') this.#life.to('killed');
    this.#idle?.stop();
    unregisterRunning(this);
    if (live.get(this.sandboxId) === this) live.delete(this.sandboxId);
  }

  /** Opt-in: on SIGINT / SIGTERM, pause the running sandboxes, then re-raise the signal. */
  static installSignalHandlers(opts: { signals?: NodeJS.Signals[]; timeoutMs?: number } = {}): () => void {
    return installSignalHandlers(opts);
  }

  /** The guest's recent console output (kernel messages, agent log lines). */
  consoleLog(): string {
    return this.#run ? tailText(this.#run.machine) : '';
  }

  /**
   * '127.0.0.1:<host port>' where the host reaches the guest's TCP `port` (one of
   * `network.ports`). INVALID_ARGUMENT for a port not forwarded; NET_BACKEND if the network
   * backend died; INVALID_STATE unless running. After a pause and connect the host port may
   * differ (a fresh backend binds it again; the same one when it is still free).
   */
  getHost(port: number): string {
    checkInt('port', port, 1, 65535);
    if (!this.#meta.network) throw new InvalidArgumentError('this sandbox has no network (network: false)');
    const network = this.#run?.network;
    if (!network) throw this.#notRunning('getHost()');
    return network.getHost(port);
  }

  /** Stops the machine and deletes the sandbox's files. Idempotent. A paused sandbox is removed
   *  as Sandbox.kill(id) removes it (SANDBOX_BUSY when another process has connected to it). */
  async kill(): Promise<void> {
    // A pause in progress finishes first (its capture is never cut off half-way).
    if (this.#pausing) await this.#pausing.catch(() => undefined);
    const st = this.#life.state;
    if (st === 'killed') return;
    if (st === 'paused' || (st === 'failed' && !this.#run)) {
      await Sandbox.kill(this.sandboxId);
      this.#markKilled();
      return;
    }
    const run = this.#run;
    this.#run = null;
    this.#markKilled();
    if (!run) return;
    run.machine.captureOnTeardown(null);
    try {
      await run.client.close();
      await run.machine.stop();
    } finally {
      await run.network?.stop().catch(() => undefined);
      try {
        await this.#dir.remove();
      } finally {
        await run.lock.release();
      }
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }
}

/**
 * A cold boot (template: false, or no template could be used): the root filesystem under the
 * sandbox's first overlay, the agent's knock. Its network backend starts while the machine is
 * built. Cleans up after itself on failure.
 */
async function bootMachine(
  dir: SandboxDir,
  meta: SandboxMeta,
  netOpts: ResolvedNetwork | false,
  net: { mac: string } | undefined,
  bootMs: number,
  growBytes?: number,
): Promise<Started> {
  let machine: Machine | undefined;
  let client: AgentClient | undefined;
  let network: SandboxNetwork | undefined;
  // passt starts while the machine is built; its failure is handled below, with the rest.
  const netReady = netOpts ? SandboxNetwork.prepare(netOpts) : undefined;
  netReady?.catch(() => undefined);
  try {
    // Built on the thread pool: the kernel file and KVM's VM setup never block the JS thread.
    machine = await Machine.build(
      guestMachineOptions(
        meta,
        {
          base: meta.rootfs,
          overlay: dir.firstOverlay,
          ...(meta.templateLayers?.length ? { frozen: meta.templateLayers } : {}),
          ...(growBytes !== undefined ? { sizeBytes: growBytes } : {}),
        },
        { consoleLog: dir.consoleLog, ...(net ? { net } : {}) },
      ),
    );
    if (netReady) {
      network = await netReady;
      network.attach(machine);
    }
    await machine.start();
    client = await awaitBootedAgent(machine, bootMs);
    // The forwarded ports were being bound while the guest booted; getHost is good from here.
    await network?.ready();
    return { machine, client, diskLayers: [...(meta.templateLayers ?? [])], ...(network ? { network } : {}) };
  } catch (err) {
    await client?.close().catch(() => undefined);
    await machine?.stop().catch(() => undefined);
    await (network ?? (await netReady?.catch(() => undefined)))?.stop().catch(() => undefined);
    throw err;
  }
}

/** The defaults every command of a sandbox gets: its envs, and its template's user and directory. */
function commandDefaultsOf(meta: SandboxMeta): CommandDefaults {
  return {
    ...(Object.keys(meta.envs).length ? { envs: meta.envs } : {}),
    ...(meta.defaults?.user ? parseImageUser(meta.defaults.user) : {}),
    ...(meta.defaults?.cwd ? { cwd: meta.defaults.cwd } : {}),
  };
}

/**
 * A sandbox from a user template: its build restored when the sandbox has the template's machine
 * (vCPUs, memory, a network device or none), else `{ reason }`: boot the template's disk.
 */
async function startFromUserTemplate(
  t: TemplateRecord,
  meta: SandboxMeta,
  dir: SandboxDir,
  netOpts: ResolvedNetwork | false,
  bootMs: number,
  growBytes?: number,
): Promise<{ started: Started } | { reason: string }> {
  const differs: string[] = [];
  if (meta.vcpus !== t.resources.cpu) differs.push(`cpu ${meta.vcpus} (template: ${t.resources.cpu})`);
  if (meta.memoryMiB !== t.resources.memoryMb) differs.push(`memoryMb ${meta.memoryMiB} (template: ${t.resources.memoryMb})`);
  if ((netOpts !== false) !== t.build.net) differs.push(netOpts === false ? 'no network device (the template has one)' : 'a network device (the template has none)');
  if (differs.length) return { reason: `the sandbox's machine differs from template ${t.name}'s: ${differs.join(', ')}; its disk boots instead` };
  const build = { name: t.name, key: '', dir: t.build.dir, diskLayers: [...t.build.diskLayers], mac: t.build.mac };
  try {
    return { started: await restoreInto(build, dir, netOpts, bootMs, growBytes) };
  } catch (err) {
    return { reason: `template ${t.name} did not restore: ${err instanceof TorporError ? `${err.code}: ${err.message.split('\n')[0]}` : String(err)}` };
  }
}

/** Sandboxes this process runs or ran, by id (connect returns the running one as it is). */
const live = new Map<string, Sandbox>();


export function tailText(machine: Machine): string {
  return machine.consoleTail().toString('utf8');
}

/** Concurrent creates (8 sandboxes at once) share one ensureArtifacts() call instead of racing
 *  to check or build the same store entries. */
const inFlight = new Map<string, ReturnType<typeof ensureArtifactsOnce>>();
function ensureArtifactsOnce(kernel: string | undefined) {
  return Promise.all([import('../setup/artifacts.js'), import('../setup/progress.js')]).then(([{ ensureArtifacts }, { streamProgress }]) => {
    // A first create that fetches or builds (a download, an image, minutes without a prebuilt
    // kernel) says so on stderr, as `torpor setup` does; one that finds everything stored
    // prints nothing. TORPOR_SETUP_PROGRESS=0 silences it.
    const sink = process.env.TORPOR_SETUP_PROGRESS === '0' ? undefined : streamProgress(process.stderr);
    const onProgress = sink && ((e: Parameters<typeof sink>[0]) => e.status !== 'cached' && sink(e));
    return ensureArtifacts({ ...(kernel ? { kernel } : {}), ...(onProgress ? { onProgress } : {}) });
  });
}
type Resolved = Awaited<ReturnType<typeof ensureArtifactsOnce>>;

/** What a later create in this process reuses: ensureArtifacts() spends 50-80 ms on store
 *  checks, while a stat of each file it named (and of the caller's kernel and setup's record)
 *  costs well under a millisecond. Any change of identity (inode, size, mtime) asks again. */
const resolved = new Map<string, { artifacts: Resolved; stamps: Array<[string, string]> }>();

async function fileStamp(path: string): Promise<string> {
  try {
    const st = await stat(path);
    return `${st.ino}:${st.size}:${st.mtimeMs}`;
  } catch {
    return 'absent';
  }
}

async function stampsOf(paths: string[]): Promise<Array<[string, string]>> {
  return Promise.all(paths.map(async (path): Promise<[string, string]> => [path, await fileStamp(path)]));
}

export async function sharedArtifacts(kernel: string | undefined): Promise<Resolved> {
  const home = torporHome();
  const supplied = kernel ?? process.env.TORPOR_KERNEL;
  const key = `${home}\0${supplied ?? ''}`;
  const hit = resolved.get(key);
  if (hit) {
    const now = await stampsOf(hit.stamps.map(([path]) => path));
    if (now.every(([, stamp], i) => stamp === hit.stamps[i]![1])) return hit.artifacts;
    resolved.delete(key);
  }
  let pending = inFlight.get(key);
  if (!pending) {
    pending = ensureArtifactsOnce(kernel).finally(() => inFlight.delete(key));
    inFlight.set(key, pending);
  }
  const artifacts = await pending;
  const watched = [artifacts.kernel, artifacts.rootfs, homeLayout(home).setupRecord, ...(supplied ? [supplied] : [])];
  resolved.set(key, { artifacts, stamps: await stampsOf(watched) });
  return artifacts;
}
