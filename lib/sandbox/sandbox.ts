// Sandbox: a Linux microVM whose guest agent runs commands and moves files, and that can be
// paused into its directory and continued later, in this process or in another one.
//
//   await using sbx = await Sandbox.create()
//   const r = await sbx.commands.run(['python3', '-c', 'print(6*7)'])
//   await sbx.pause()                                   // RAM, processes, files: into its directory
//   const again = await Sandbox.connect(sbx.sandboxId)  // hours later, from any process
//
// create(): its options checked (sandbox-options.ts) -> this host can boot a Linux guest
// (host-check.ts) -> the kernel and root filesystem, with the agent as /usr/sbin/torpor-agent
// (artifacts-cache.ts) -> its directory with the owner lock taken, the warm template for its
// settings restored into it or, without one, a cold boot (create.ts, over guest-run.ts).
// connect(): resume.ts. pause(): pause.ts. A process that ends with it running: exit-capture.ts.
// Which sandboxes this process holds: live.ts. pause() / connect(): docs/sandbox-lifecycle.md.
// States and transitions: lifecycle.ts.
import { EventEmitter } from 'node:events';
import { existsSync } from 'node:fs';

import { InvalidArgumentError, KvmUnavailableError, abortError, SandboxNotFoundError, TemplateNotFoundError, TorporError } from '../errors.js';
import type { AgentClient } from '../agent/client.js';
import type { NetworkOptions } from '../net/options.js';
import { checkKernelFile } from '../setup/kernel-format.js';
import { takeOwnerLock, type OwnerLock } from '../store/owner-lock.js';
import { readGenerationFiles } from '../store/snapshot-files.js';
import { SandboxDir, checkSandboxId, sandboxIds, type OnTimeout, type SandboxMeta } from '../store/sandbox-dir.js';
import { readTemplateRecord, type TemplateRecord } from '../template/record.js';
import { mergeResourceAliases, type ResourcesOpts } from '../template/resources.js';
import type { Machine } from '../vm/machine.js';
import { agentApiWith } from './agent-api.js';
import { resumingOnCall } from './auto-resume.js';
import { sharedArtifacts } from './artifacts-cache.js';
import type { Commands } from './commands.js';
import { startSandbox } from './create.js';
import { captureNow, captureOnTeardown } from './exit-capture.js';
import type { Files } from './files.js';
import { linuxGuestSupport } from './host-check.js';
import { IdleTimer } from './idle-timer.js';
import { infoOf, type SandboxInfo } from './info.js';
import { Lifecycle, type SandboxState } from './lifecycle.js';
import { SANDBOX_BUSY, addLive, dropLive, liveSandbox } from './live.js';
import { SandboxPaginator } from './paginator.js';
import { pausedMeta, recordPaused, syncBeforeCapture } from './pause.js';
import { installSignalHandlers, registerRunning, unregisterRunning } from './process-exit.js';
import type { Pty } from './pty.js';
import { resume, type ConnectOpts, type Running } from './resume.js';
import { checkConnectOpts, checkCreateOpts, checkSetTimeout, commandDefaultsOf, listFilter, normalizeCreateArgs } from './sandbox-options.js';
import { abortable, throwIfAborted } from './deadline.js';
import { checkInt, checkKnownKeys, checkObject, checkSignal, checkString, fail } from './validate.js';
import { captureLive, findCheckpoint, listCheckpoints, writeCheckpoint, type Checkpoint } from './checkpoints.js';
import { dropForkBaseIfUnused, makeForkBase, startChild } from './fork.js';

export type { ConnectOpts } from './resume.js';
export type { SandboxInfo } from './info.js';
export type { SandboxState } from './lifecycle.js';
export { linuxGuestSupport } from './host-check.js';
export { sharedArtifacts } from './artifacts-cache.js';
export { AGENT_KNOCK_PORT, AGENT_VSOCK_PORT, GUEST_CID, GUEST_CMDLINE, awaitBootedAgent, awaitRestoredAgent } from './readiness.js';

/** How {@link Sandbox.create} makes a sandbox. Every field is optional. */
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
  /** What `await using` does at the end of its scope: 'kill' (default: the sandbox and its files
   *  go) or 'pause' (it stays, paused, for a later connect). */
  onDispose?: 'kill' | 'pause';
  /** E2B's name for resources.cpu. */
  cpuCount?: number;
  /** E2B's name for resources.memoryMb. */
  memoryMB?: number;
  /** E2B's options with no meaning here (there is no service to reach): accepted and ignored,
   *  with a one-time warning, so E2B code runs unchanged. */
  apiKey?: unknown;
  /** See `apiKey`. */
  domain?: unknown;
  /** See `apiKey`. */
  secure?: unknown;
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
  /** What happens at the end of `timeoutMs`. */
  lifecycle?: {
    /** What the timeout does: 'kill' (default) or 'pause' (a paused sandbox costs disk only). */
    onTimeout?: OnTimeout;
    /** With onTimeout 'pause': the next call on the idle-paused sandbox (commands, files, pty)
     *  resumes it first, in this process, and then runs (E2B's option). A sandbox paused by
     *  `pause()` stays paused until resumed. Kept across pause and connect. */
    autoResume?: boolean;
  };
  /** Abort the create: it rejects with AbortError (ABORTED) and no sandbox is left (one that
   *  had started is killed first). */
  signal?: AbortSignal;
  /** The guest's network (lib/net/options.ts): egress on, host loopback off by default; false: no
   *  network device. Kept across pause and connect (a fresh backend each run: docs/network.md). */
  network?: NetworkOptions | false;
}


/** What {@link Sandbox.pause} did. */
export interface PauseResult {
  /** The sandbox paused. */
  sandboxId: string;
  /** The snapshot generation written (1 for the first pause, then one more each time). */
  generation: number;
  /** Bytes the generation wrote. */
  bytes: number;
  /** Machine state and memory read (ms from the capture's start), and the generation durable. */
  capturedMs: number;
  /** When the generation was on disk for good (ms from the capture's start). */
  durableMs: number;
  /** When the pause completed. */
  pausedAt: Date;
}


/** Sandbox.list's filters. */
export interface ListOpts {
  /** Sandboxes per page of the paginator's `nextItems()` (E2B's option; default 100). */
  limit?: number;
  /** Only sandboxes in this state, or in one of these states. */
  state?: SandboxState | SandboxState[];
  /** Only sandboxes whose metadata has every one of these keys with these values. */
  metadata?: Record<string, string>;
}

/**
 * A Linux microVM this process runs on /dev/kvm, with a guest agent to run commands, move files
 * and open terminals. Make one with {@link Sandbox.create}, continue one with
 * {@link Sandbox.connect}; {@link Sandbox.pause} freezes it to disk, {@link Sandbox.kill} removes
 * it. `await using sbx = await Sandbox.create()` kills it at the end of the scope.
 * docs/sandbox-lifecycle.md explains the states and what survives a pause.
 */
/** Why the sandbox paused or was killed: a call of yours, or its idle timeout. */
export type SandboxEventCause = 'call' | 'timeout';

/** What a Sandbox emits (it is a typed EventEmitter). */
export interface SandboxEvents {
  /** The sandbox paused (by `pause()`, or its idle timeout with `onTimeout: 'pause'`). */
  paused: [event: { sandboxId: string; generation: number; cause: SandboxEventCause }];
  /** The paused object continued (`resume()` / `connect()`), from memory or from its disk. */
  resumed: [event: { sandboxId: string; from: 'memory' | 'disk' }];
  /** The sandbox was killed (by `kill()`, `Sandbox.kill(id)` in this process, or its idle timeout). */
  killed: [event: { sandboxId: string; cause: SandboxEventCause }];
  /** The guest or its machine ended by itself (a panic, a reset, a poweroff): the sandbox failed. */
  exit: [event: { sandboxId: string; state: string; kind: string; message: string }];
  /** Something failed with no caller to tell: the idle timeout's pause or kill, or the network
   *  backend ending on its own (NET_BACKEND; the next connect starts a new one). Without an
   *  'error' listener it is reported as a process warning instead (never an uncaught error). */
  error: [error: Error];
}

/** The most children one fork() makes. */
const MAX_FORK = 64;
/** How long a fork's child has to answer after its restore. */
const FORK_AGENT_TIMEOUT_MS = 30_000;

export class Sandbox extends EventEmitter<SandboxEvents> implements AsyncDisposable {
  /** The sandbox's id: its directory's name under TORPOR_HOME, what connect, getInfo and kill take. */
  readonly sandboxId: string;
  /** Runs processes in the guest. */
  readonly commands: Commands;
  /** Reads, writes and watches the guest's files. */
  readonly files: Files;
  /** Opens terminals (pseudo-terminals) in the guest. */
  readonly pty: Pty;
  /** The sandbox's directory (tests and diagnostics read it; the API does not expose it). */
  private readonly dir: string;
  readonly #dir: SandboxDir;
  #meta: SandboxMeta;
  #run: Running | null;
  readonly #life: Lifecycle;
  #idle: IdleTimer | undefined;
  /** Foreground commands.run calls in flight: a pause lets them finish first, and the idle
   *  timer does not fire while there is one. */
  readonly #foreground = new Set<Promise<unknown>>();
  /** Requests the sandbox itself sends while pausing (SYNC). */
  #internal = false;
  /** The pause in progress: connect and kill in this process wait for it. */
  #pausing: Promise<PauseResult> | null = null;
  /** The last pause was the idle timer's (lifecycle.autoResume resumes only those). */
  #idlePaused = false;
  /** The operations that capture or change meta.json (pause, checkpoint, fork's capture,
   *  removeCheckpoint, restore's discard), one after the other: each reads the sandbox as the
   *  one before left it. kill waits for the one under way. */
  #op: Promise<unknown> = Promise.resolve();
  #opsPending = 0;
  /** An auto resume under way: concurrent calls share it. */
  #autoResuming: Promise<void> | null = null;
  /** Set while the idle timeout acts, so the events it causes say so. */
  #cause: SandboxEventCause = 'call';
  #onDispose: 'kill' | 'pause' = 'kill';

  private constructor(dir: SandboxDir, meta: SandboxMeta, run: Running) {
    super();
    this.sandboxId = dir.id;
    this.dir = dir.path;
    this.#dir = dir;
    this.#meta = meta;
    this.#run = run;
    this.#life = new Lifecycle('running', `sandbox ${dir.id}`);
    // Foreground runs are tracked so that a pause waits for them (docs/sandbox-lifecycle.md).
    const api = agentApiWith(() => this.client, commandDefaultsOf(meta), {
      onForeground: (p) => {
        this.#foreground.add(p);
        // Its end is activity: the lifecycle timeout counts from it, not from the timer's last check.
        const done = () => {
          this.#foreground.delete(p);
          this.#idle?.touch();
        };
        p.then(done, done);
      },
    });
    // lifecycle.autoResume: the next call after an idle pause resumes first (auto-resume.ts).
    const resumeFirst = () => this.#autoResumeFirst();
    this.commands = resumingOnCall(api.commands, resumeFirst);
    this.files = resumingOnCall(api.files, resumeFirst);
    this.pty = resumingOnCall(api.pty, resumeFirst);
    this.#adopt(run);
    this.#armTimeout();
    registerRunning(this);
    addLive(this);
  }

  /** Alias of sandboxId. */
  get id(): string {
    return this.sandboxId;
  }

  /** The sandbox's state in this process: running, pausing, paused, resuming, killed or failed. */
  get state(): SandboxState {
    return this.#life.state;
  }

  /** Whether the sandbox is running in this process (`state === 'running'`). */
  isRunning(): boolean {
    return this.#life.state === 'running';
  }

  /** The running machine (tests and diagnostics read it; the API does not expose it). */
  private get machine(): Machine {
    if (!this.#run) throw this.#notRunning('the machine');
    return this.#run.guest.machine;
  }

  private get client(): AgentClient {
    if (!this.#run) throw this.#notRunning('this request');
    return this.#run.guest.client;
  }

  #notRunning(what: string): TorporError {
    try {
      this.#life.require(what, 'running');
    } catch (err) {
      return err as TorporError;
    }
    return new TorporError('INVALID_STATE', `${what}: sandbox ${this.sandboxId} has no machine`);
  }

  /** Whether a call must resume the sandbox first (lifecycle.autoResume after an idle pause):
   *  the resume to wait for, or null to go straight on. */
  #autoResumeFirst(): Promise<void> | null {
    if (!this.#meta.autoResume) return null;
    if (this.#autoResuming) return this.#autoResuming;
    const state = this.#life.state;
    if (!this.#idlePaused || (state !== 'paused' && state !== 'pausing')) return null;
    this.#autoResuming = this.resume()
      .then(() => undefined)
      .finally(() => {
        this.#autoResuming = null;
      });
    return this.#autoResuming;
  }

  /** Hooks a new machine and client into the sandbox: activity, and the guest ending by itself. */
  #adopt(run: Running): void {
    const { client, machine, network } = run.guest;
    // A worker thread that ends with this sandbox running (no JS runs there): the addon's cleanup
    // hook captures it into the next generation; connect finds it newer than meta.json says.
    captureOnTeardown(machine, this.#dir);
    // An idle session does not keep the process alive: Node reaches beforeExit, which pauses.
    client.setIdleUnref(true);
    // Requests are refused unless the sandbox runs (its own SYNC while pausing excepted); they and
    // their answers count as activity for the lifecycle timeout.
    client.setRequestHooks({
      beforeOpen: () => {
        if (this.#life.state !== 'running' && !this.#internal) this.#life.require('a request to the agent', 'running');
      },
      onActivity: () => this.#idle?.touch(),
    });
    // The network backend ending on its own (crashed, killed) leaves the guest without a network
    // until the next connect: nobody is waiting on it, so it is an 'error' event (NET_BACKEND).
    network?.onFailure((err) => {
      // Only for this run, and not when the machine itself ended (its exit event says that).
      if (this.#run?.guest.network !== network || machine.state !== 'running') return;
      const st = this.#life.state;
      if (st !== 'running' && st !== 'resuming' && st !== 'starting') return;
      this.#reportError(new TorporError('NET_BACKEND', `sandbox ${this.sandboxId}: ${err.message}; pause and connect start a new one`, { cause: err }));
    });
    // A guest that stops by itself (panic, reset, poweroff) takes the agent with it: end the
    // session now rather than letting requests wait for reconnects that cannot succeed.
    // The requests it fails say why the machine ended (a guest panic's last console line).
    machine.once('exit', (state, reason) => {
      if (this.#run?.guest.machine !== machine || this.#life.state !== 'running') return;
      const last = reason.consoleTail.trimEnd().split('\n').slice(-1)[0] ?? '';
      void client.close(`the sandbox's machine ended (${state}, ${reason.kind}: ${reason.message}); console: ${last.slice(-200)}`);
      void network?.stop().catch(() => undefined);
      this.#idle?.stop();
      this.#life.to('failed');
      unregisterRunning(this);
      this.emit('exit', { sandboxId: this.sandboxId, state, kind: reason.kind, message: reason.message });
    });
  }

  /** An 'error' event when someone listens; a process warning otherwise (an 'error' event with no
   *  listener would throw, and no caller is waiting for this failure). */
  #reportError(err: Error): void {
    if (this.listenerCount('error') > 0) this.emit('error', err);
    else process.emitWarning(`sandbox ${this.sandboxId}: ${err.message}`, { code: 'TORPOR_SANDBOX_ERROR' });
  }

  #armTimeout(): void {
    this.#idle?.stop();
    this.#idle = undefined;
    const ms = this.#meta.timeoutMs;
    if (!ms) return;
    this.#idle = new IdleTimer(ms, () => {
      if (this.#life.state !== 'running') return;
      this.#cause = 'timeout';
      const act = this.#meta.onTimeout === 'pause' ? this.pause() : this.#kill('timeout');
      this.#cause = 'call';
      act.catch((err: unknown) => this.#reportError(err instanceof Error ? err : new Error(String(err))));
    }, () => this.#foreground.size > 0);
    this.#idle.start();
  }

  /**
   * Starts a new sandbox: from the warm template by default (a restore, milliseconds), or a cold
   * boot with `template: false`. The first create for a template's settings boots and captures
   * the template once.
   *
   * @param opts - The template, size, environment, network and lifecycle; all optional.
   * @returns The sandbox, running, its agent answering.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for an option out of range.
   * @throws {@link TemplateNotFoundError} (TEMPLATE_NOT_FOUND) for a template name that was never built.
   * @throws {@link KvmUnavailableError} (KVM_UNAVAILABLE) when this host cannot run a Linux guest.
   * @throws {@link TorporError} KERNEL_INVALID for a kernel file that is not a bootable kernel;
   *   BOOT_FAILED, or {@link GuestUnresponsiveError} (GUEST_UNRESPONSIVE) when the guest did not come up.
   */
  static async create(opts?: SandboxOpts): Promise<Sandbox>;
  /** E2B's form: the template by name first (`Sandbox.create('node22', { timeoutMs })`). */
  static async create(template: string, opts?: SandboxOpts): Promise<Sandbox>;
  static async create(first: string | SandboxOpts = {}, second?: SandboxOpts): Promise<Sandbox> {
    const opts = normalizeCreateArgs(first, second);
    checkCreateOpts(opts);
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

    throwIfAborted(opts.signal, 'Sandbox.create');
    // The artifacts are shared (a kernel being built goes on for the next create): an abort only stops waiting.
    const artifacts = await abortable(sharedArtifacts(opts.boot?.kernel), opts.signal, 'Sandbox.create', () => undefined);
    if (!artifacts.linuxBootable) {
      throw new KvmUnavailableError(`cannot start a Linux sandbox on this host: ${artifacts.notes.join(' ')}`);
    }
    // An abort while the machine starts waits for it and kills it: no sandbox is left.
    const starting = startSandbox(opts, { template, user, sizes, artifacts });
    const { dir, meta, run } = await abortable(starting, opts.signal, 'Sandbox.create', async () => {
      const started = await starting.catch(() => null);
      if (started) await new Sandbox(started.dir, started.meta, started.run).kill();
    });
    const sbx = new Sandbox(dir, meta, run);
    if (opts.onDispose) sbx.#onDispose = opts.onDispose;
    return sbx;
  }

  /**
   * Freezes the sandbox into its directory and gives back its CPU and memory: foreground
   * `commands.run` calls in flight finish first (new requests are refused meanwhile), the agent
   * runs `sync`, the machine is captured durably (a full memory image the first time, the pages
   * written since after that) and stopped, the owner lock is released. The sandbox is then
   * `paused`: `Sandbox.connect(sandboxId)` continues it, from this process or another.
   *
   * @param opts - `signal`: abort while the pause still waits for foreground commands and the
   *   guest's sync: it rejects with AbortError (ABORTED) and the sandbox runs on. Once its machine
   *   is being captured the pause completes (a half-written pause is what an abort must not leave).
   * @returns What the capture wrote and how long it took.
   * @throws {@link IllegalTransitionError} (INVALID_STATE) unless the sandbox is running.
   * @throws {@link NotEnoughSpaceError} (OUT_OF_SPACE) when the host's disk is full; a capture that
   *   fails before the machine stopped leaves the sandbox running.
   * @throws {@link AbortError} (ABORTED) when `opts.signal` aborted it before the capture began.
   */
  pause(opts: { signal?: AbortSignal } = {}): Promise<PauseResult> {
    try {
      checkObject('opts', opts);
      checkKnownKeys('opts', opts, ['signal']);
      checkSignal('opts.signal', opts.signal);
      this.#life.require('pause()', 'running');
      throwIfAborted(opts.signal, `pause ${this.sandboxId}`);
    } catch (err) {
      return Promise.reject(err);
    }
    // A pause asked for while one is under way is that pause.
    if (this.#pausing) return this.#pausing;
    const cause = this.#cause;
    this.#idlePaused = cause === 'timeout';
    const p = this.#serially(() => this.#pauseNow(opts.signal));
    p.then((r) => this.emit('paused', { sandboxId: this.sandboxId, generation: r.generation, cause }), () => undefined);
    this.#pausing = p;
    const clear = () => {
      if (this.#pausing === p) this.#pausing = null;
    };
    p.then(clear, clear);
    return p;
  }

  /** Runs `fn` after the operations before it (#op); at once when none is under way, so that
   *  what it does before its first await (pause's move to 'pausing') happens in the call. */
  #serially<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.#opsPending === 0 ? fn() : this.#op.then(fn, fn);
    this.#opsPending++;
    const done = () => {
      this.#opsPending--;
    };
    run.then(done, done);
    this.#op = run.catch(() => undefined);
    return run;
  }

  async #pauseNow(signal: AbortSignal | undefined): Promise<PauseResult> {
    // Queued behind a checkpoint or a fork: the sandbox as that left it (or killed meanwhile).
    this.#life.require('pause()', 'running');
    const run = this.#run!;
    this.#life.to('pausing');
    run.guest.machine.captureOnTeardown(null);
    this.#idle?.stop();
    // Until the capture begins an abort leaves the sandbox as it was: running, its exit capture
    // and idle timer armed again.
    let aborted = false;
    const runOn = () => {
      aborted = true;
      captureOnTeardown(run.guest.machine, this.#dir);
      this.#life.to('running');
      this.#idlePaused = false;
      this.#armTimeout();
    };
    await abortable(this.#settleBeforeCapture(run), signal, `pause ${this.sandboxId}`, runOn);
    // An abort that came as the wait ended (in the same turn) has already put it back to running.
    if (aborted) throw abortError(signal!, `pause ${this.sandboxId}`);
    const pausedAt = new Date();
    if (!existsSync(this.#dir.metaPath)) {
      // The directory was removed under a running sandbox (a test's temporary home): a capture
      // would recreate it. The sandbox ends instead.
      await run.guest.stop().catch(() => undefined);
      this.#run = null;
      unregisterRunning(this);
      await run.lock.release();
      this.#life.to('failed');
      throw new SandboxNotFoundError(`sandbox ${this.sandboxId}: its directory ${this.dir} was removed; nothing to pause into`);
    }
    let snap;
    try {
      // The machine captured and stopped, then its backend ends, and every host-side flow with it
      // (open network connections are closed on pause; docs/network.md).
      snap = await run.guest.capture(this.#dir.snapshots);
    } catch (err) {
      await this.#captureFailed(run);
      throw err;
    }
    const paused = pausedMeta(this.#dir, this.#meta, run, snap, pausedAt);
    this.#meta = paused;
    try {
      await recordPaused(this.#dir, paused);
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

  /** What a pause waits for before the capture: foreground commands, then the guest's sync. */
  async #settleBeforeCapture(run: Running): Promise<void> {
    // Captured while the guest still ran would be fine for memory, but the output of a command
    // finishing during the capture would reach nobody: let them end first.
    await Promise.allSettled([...this.#foreground]);
    this.#internal = true;
    try {
      await syncBeforeCapture(run.guest.client);
    } finally {
      this.#internal = false;
    }
  }

  /** The process is ending (an `exit` handler): capture now, synchronously, and record the
   *  sandbox as paused. Best effort: a failure leaves it as a dead owner's (connect restores the
   *  last generation). The lock dies with the process. */
  captureOnExit(): void {
    const run = this.#run;
    // A directory removed under a running sandbox (a test's temporary home) is not recreated.
    if (!run || this.#life.state !== 'running' || !existsSync(this.#dir.metaPath)) return;
    try {
      this.#meta = captureNow(this.#dir, this.#meta, run);
      this.#dir.writeMetaSync(this.#meta);
      this.#life.to('pausing');
      this.#life.to('paused');
    } catch {
      // left as it was: recovered by the next connect
    }
  }

  /** A capture that failed: a machine that still runs goes on (with a new client); one that
   *  stopped leaves the sandbox `failed`, its directory as the last generation left it. */
  async #captureFailed(run: Running): Promise<void> {
    const st = run.guest.machine.state;
    if (st === 'running' || st === 'paused') {
      try {
        this.#run = { ...run, guest: await run.guest.reattach(10_000) };
        this.#adopt(this.#run);
        this.#life.to('running');
        this.#armTimeout();
        return;
      } catch {
        // fall through: stop it
      }
    }
    await run.guest.stop().catch(() => undefined);
    this.#run = null;
    unregisterRunning(this);
    await run.lock.release().catch(() => undefined);
    this.#life.to('failed');
  }

  /**
   * Continues a sandbox: the one this process runs (returned as it is), or a paused one, or one
   * whose owner died (recovered from its last generation; getInfo().lostInterval says since
   * when work is lost). SANDBOX_NOT_FOUND when there is no such sandbox, SANDBOX_BUSY (naming
   * the pid) when another live process runs it. From memory by default: the restored guest's
   * agent gets RESUMED (host clock, fresh entropy) before anything else; when the memory image
   * cannot be used, the same generation's disk boots instead (`resumedFrom: 'disk'`, the reason
   * in `resumeReason`).
   *
   * @param sandboxId - The id ({@link Sandbox.sandboxId}, {@link Sandbox.list}), or what `pause()`
   *   returned (E2B code passes on what its `pause()` returns).
   * @param opts - How to resume; all optional.
   * @returns The sandbox, running.
   * @throws {@link SandboxNotFoundError} (SANDBOX_NOT_FOUND) when there is no such sandbox.
   * @throws {@link SandboxBusyError} (SANDBOX_BUSY) when another live process runs it.
   * @throws {@link IllegalTransitionError} (INVALID_STATE) when this process holds it in a state
   *   connect cannot continue (its guest ended by itself: kill it).
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for a malformed id or option.
   */
  static async connect(sandboxId: string | PauseResult, opts: ConnectOpts = {}): Promise<Sandbox> {
    const id = typeof sandboxId === 'object' && sandboxId !== null ? sandboxId.sandboxId : sandboxId;
    checkSandboxId(id);
    checkConnectOpts(opts);
    const mine = liveSandbox(id);
    if (mine && mine.#pausing) await mine.#pausing.catch(() => undefined);
    if (mine && mine.#life.state === 'running') return opts.checkpoint !== undefined ? mine.restore(opts.checkpoint, withoutCheckpoint(opts)) : mine;
    if (mine && mine.#run) {
      // This process holds it, in a state connect cannot continue (its guest ended by itself).
      throw new TorporError('INVALID_STATE', `sandbox ${id} is ${mine.#life.state} in this process (its guest ended); kill() it, or connect to another one`);
    }
    const dir = new SandboxDir(id);
    if (!(await dir.exists())) throw new SandboxNotFoundError(`no sandbox ${id} in ${dir.path} (Sandbox.list() shows the ones there are)`);
    const taken = await takeOwnerLock(dir.lockPath).catch(async (err: unknown) => {
      if (!(await dir.exists())) throw new SandboxNotFoundError(`sandbox ${id} was removed`, { cause: err });
      throw err;
    });
    if (!taken.ok) throw SANDBOX_BUSY(id, taken.ownerPid);
    const lock = taken.lock;
    try {
      throwIfAborted(opts.signal, `connect ${id}`);
      // An abort while it resumes waits for the machine and pauses it again: it stays paused.
      const resuming = resume(dir, await dir.readMeta(), lock, opts);
      const { meta, run } = await abortable(resuming, opts.signal, `connect ${id}`, async () => {
        const resumed = await resuming.catch(() => null);
        if (resumed) await Sandbox.#pauseAfterAbort(dir, resumed);
      });
      const sbx = new Sandbox(dir, meta, run);
      if (opts.onDispose) sbx.#onDispose = opts.onDispose;
      return sbx;
    } catch (err) {
      await lock.release().catch(() => undefined);
      throw err;
    }
  }

  /**
   * Continues this paused sandbox in place (E2B's `sbx.connect()`): the same object runs again, from memory, or booted from
   * its disk when the memory image cannot be restored (`getInfo().resumedFrom` says which). A
   * running sandbox resolves at once.
   *
   * @param opts - As for {@link Sandbox.connect}.
   * @returns This sandbox, running.
   * @throws {@link IllegalTransitionError} (INVALID_STATE) once it was killed or failed.
   * @throws {@link SandboxBusyError} (SANDBOX_BUSY) when another process connected to it meanwhile.
   * @throws {@link SandboxNotFoundError} (SANDBOX_NOT_FOUND) when its directory was removed.
   */
  async resume(opts: ConnectOpts = {}): Promise<this> {
    checkConnectOpts(opts);
    if (this.#pausing) await this.#pausing.catch(() => undefined);
    if (this.#life.state === 'running') return opts.checkpoint !== undefined ? this.restore(opts.checkpoint, withoutCheckpoint(opts)) : this;
    this.#life.require('resume()', 'paused');
    if (opts.onDispose) this.#onDispose = opts.onDispose;
    // Sandbox.connect(id) made another object for it since: that one is the sandbox now.
    if (liveSandbox(this.sandboxId) !== this) {
      throw new TorporError('INVALID_STATE', `sandbox ${this.sandboxId} is held by another Sandbox object in this process (made by Sandbox.connect); use that one`);
    }
    const dir = this.#dir;
    if (!(await dir.exists())) throw new SandboxNotFoundError(`sandbox ${this.sandboxId} was removed (${dir.path})`);
    const taken = await takeOwnerLock(dir.lockPath);
    if (!taken.ok) throw SANDBOX_BUSY(this.sandboxId, taken.ownerPid);
    return this.#resumeWith(taken.lock, opts);
  }

  /** resume() once the owner lock is held: the machine restored (or booted) and adopted. */
  async #resumeWith(lock: OwnerLock, opts: ConnectOpts): Promise<this> {
    const dir = this.#dir;
    this.#life.to('resuming');
    try {
      throwIfAborted(opts.signal, `resume ${this.sandboxId}`);
      // An abort while it resumes waits for the machine and pauses it again (through a Sandbox
      // object of its own, which then gives the id back to this one): it stays paused.
      const resuming = resume(dir, await dir.readMeta(), lock, opts);
      const { meta, run } = await abortable(resuming, opts.signal, `resume ${this.sandboxId}`, async () => {
        const resumed = await resuming.catch(() => null);
        if (!resumed) return;
        await Sandbox.#pauseAfterAbort(dir, resumed);
        addLive(this);
        this.#meta = await dir.readMeta();
      });
      this.#meta = meta;
      this.#run = run;
      this.#adopt(run);
      this.#life.to('running');
      this.#idlePaused = false;
      this.#armTimeout();
      registerRunning(this);
      addLive(this);
      this.emit('resumed', { sandboxId: this.sandboxId, from: meta.resumedFrom ?? 'memory' });
      return this;
    } catch (err) {
      await lock.release().catch(() => undefined);
      if (this.#life.state === 'resuming') this.#life.to('paused');
      throw err;
    }
  }

  /** An aborted connect's machine, running again: paused again; should that fail, stopped
   *  without a capture (the last generation stays what a connect restores), never left running
   *  once the caller lets the lock go. */
  static async #pauseAfterAbort(dir: SandboxDir, resumed: { meta: SandboxMeta; run: Running }): Promise<void> {
    const sbx = new Sandbox(dir, resumed.meta, resumed.run);
    try {
      await sbx.pause();
    } catch {
      if (sbx.#run) await sbx.#discard(sbx.#run);
    }
  }

  /**
   * Writes a checkpoint: the guest syncs and the machine is captured into a new generation while
   * it runs on (a pause's capture without the stop: memory pages and disk blocks written since the
   * last generation). {@link Sandbox.restore} goes back to it later, in this process or after a
   * connect. Checkpoints are kept, with their files, until removed or restored past
   * (docs/sandbox-lifecycle.md#checkpoints).
   *
   * @param label - A name for it (`restore('before-migration')` finds the latest with it).
   * @returns The checkpoint: its id, label, time and the bytes its generation wrote.
   * @throws {@link IllegalTransitionError} (INVALID_STATE) unless the sandbox is running, or when
   *   it holds 64 checkpoints already.
   */
  async checkpoint(label?: string): Promise<Checkpoint> {
    checkString('label', label, { nonEmpty: true });
    if (label !== undefined && Buffer.byteLength(label) > 256) fail('label', 'at most 256 bytes', label);
    this.#life.require('checkpoint()', 'running');
    return this.#serially(async () => {
      this.#life.require('checkpoint()', 'running');
      const run = this.#run!;
      const { meta, diskLayers, checkpoint } = await writeCheckpoint(this.#dir, this.#meta, run, label);
      this.#meta = meta;
      if (this.#run === run) this.#run = { ...run, diskLayers };
      return checkpoint;
    });
  }

  /**
   * The sandbox's checkpoints, oldest first, with the bytes each holds on disk. Any process may
   * ask, running or paused.
   *
   * @returns One {@link Checkpoint} per checkpoint kept.
   */
  async checkpoints(): Promise<Checkpoint[]> {
    return listCheckpoints(this.#dir, this.#run ? this.#meta : await this.#dir.readMeta());
  }

  /**
   * Forgets a checkpoint: its generation's files go at the next pause (those a later generation
   * still needs stay).
   *
   * @param checkpoint - Its id, its label, or what checkpoint() returned.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) when there is no such checkpoint.
   * @throws {@link IllegalTransitionError} (INVALID_STATE) unless the sandbox is running in this process.
   */
  async removeCheckpoint(checkpoint: number | string | Pick<Checkpoint, 'id'>): Promise<void> {
    this.#life.require('removeCheckpoint()', 'running');
    return this.#serially(async () => {
      this.#life.require('removeCheckpoint()', 'running');
      const c = findCheckpoint(this.#meta, checkpoint);
      const meta = { ...this.#meta, checkpoints: (this.#meta.checkpoints ?? []).filter((k) => k !== c) };
      await this.#dir.writeMeta(meta);
      this.#meta = meta;
    });
  }

  /**
   * Goes back to a checkpoint: the machine (running or paused) is discarded, not captured, and
   * the checkpoint's generation restored in its place (its memory, processes and disk as they
   * were); the checkpoints after it go. What the agent did since is undone. The same object
   * runs on.
   *
   * @param checkpoint - Its id, its label (the latest with it), or what checkpoint() returned.
   * @param opts - As for {@link Sandbox.connect}.
   * @returns This sandbox, running from the checkpoint.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) when there is no such checkpoint.
   * @throws {@link TorporError} SNAPSHOT_INVALID when its generation is damaged (nothing changed).
   */
  async restore(checkpoint: number | string | Pick<Checkpoint, 'id'>, opts: ConnectOpts = {}): Promise<this> {
    checkConnectOpts(opts);
    // The checkpoint is found and its generation validated before anything is discarded.
    const c = findCheckpoint(this.#run ? this.#meta : await this.#dir.readMeta(), checkpoint);
    readGenerationFiles(this.#dir.snapshots, c.generation);
    if (this.#pausing) await this.#pausing.catch(() => undefined);
    const held = await this.#serially(async () => {
      const run = this.#run;
      if (!run || this.#life.state !== 'running') return null;
      // Discarded, not captured: what ran since the checkpoint is what restore undoes. The lock
      // stays held across the restore: no other process takes the sandbox in between.
      this.#life.to('pausing');
      await this.#discard(run);
      this.#life.to('paused');
      return run.lock;
    });
    if (!held) return this.resume({ ...opts, checkpoint: c.generation });
    return this.#resumeWith(held, { ...opts, checkpoint: c.generation });
  }

  /** Stops a machine without capturing it (restore's discard, an abort's last resort). */
  async #discard(run: Running): Promise<void> {
    run.guest.machine.captureOnTeardown(null);
    this.#idle?.stop();
    await run.guest.stop().catch(() => undefined);
    if (this.#run === run) this.#run = null;
    unregisterRunning(this);
  }

  /**
   * Forks the sandbox: `count` new sandboxes continue it from this moment, each with its own id,
   * directory, owner lock and network backend, and fresh entropy (RESUMED) before anything runs
   * in it; this one runs on. Its memory is captured once (a generation, the pages written since
   * the last one) and shared copy-on-write; each child's disk writes go to a layer of its own.
   * Parent and children diverge from there and are independent: killing one leaves the others.
   * docs/sandbox-lifecycle.md#fork.
   *
   * @param count - How many children (1 to 64; default 1).
   * @returns The children, running, in this process.
   * @throws {@link IllegalTransitionError} (INVALID_STATE) unless the sandbox is running.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for a count out of range.
   */
  async fork(count = 1): Promise<Sandbox[]> {
    checkInt('count', count, 1, MAX_FORK);
    this.#life.require('fork()', 'running');
    // The capture and the links into the fork base, before anything (a pause's prune, a restore,
    // a kill) may remove the generation's files.
    const { base, agentHello } = await this.#serially(async () => {
      this.#life.require('fork()', 'running');
      const run = this.#run!;
      // The children's VM shells are built while the parent is captured, as machine.fork does.
      run.guest.machine.prepareRestores(count);
      const r = await captureLive(this.#dir, this.#meta, run);
      this.#meta = r.meta;
      if (this.#run === run) this.#run = { ...run, diskLayers: r.diskLayers };
      return { base: await makeForkBase(this.#dir, r.snap.generation, ''), agentHello: run.guest.client.hello };
    });
    // All or none: a child that does not start takes the others (and the base) with it.
    const results = await Promise.allSettled(Array.from({ length: count }, () => startChild(base, this.#meta, FORK_AGENT_TIMEOUT_MS, agentHello)));
    const started = results.flatMap((r) => (r.status === 'fulfilled' ? [new Sandbox(r.value.dir, r.value.meta, r.value.run)] : []));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await Promise.allSettled(started.map((s) => s.kill()));
      await dropForkBaseIfUnused(base.dir).catch(() => false);
      throw failed.reason;
    }
    for (const child of started) child.#onDispose = this.#onDispose;
    return started;
  }

  /** E2B's name for {@link Sandbox.resume} on an instance. */
  connect(opts: ConnectOpts = {}): Promise<this> {
    return this.resume(opts);
  }

  /** The sandboxes under TORPOR_HOME, optionally only those in a state (or states) and with
   *  the given metadata; `{ query: { state, metadata } }` (E2B's shape) works too.
   *
   * @param opts - The filters; none lists them all.
   * @returns One {@link SandboxInfo} per sandbox (a directory that cannot be read is left out).
   */
  static list(opts: ListOpts & { query?: ListOpts } = {}): SandboxPaginator {
    let filter: ReturnType<typeof listFilter>;
    try {
      filter = listFilter(opts);
    } catch (err) {
      return new SandboxPaginator(() => Promise.reject(err), 1); // refused when used, as an async list() was
    }
    const { states: want, metadata, limit } = filter;
    return new SandboxPaginator(async () => {
      const out: SandboxInfo[] = [];
      for (const id of await sandboxIds()) {
        const info = await Sandbox.getInfo(id).catch(() => null);
        if (!info || (want && !want.includes(info.state))) continue;
        if (metadata && !Object.entries(metadata).every(([k, v]) => info.metadata[k] === v)) continue;
        out.push(info);
      }
      return out;
    }, limit);
  }

  /**
   * Sets the lifecycle timeout from now on (E2B's setTimeout): `timeoutMs` without activity, then
   * `lifecycle.onTimeout`; 0 turns it off. Kept in meta.json, so it survives pause and connect.
   *
   * @param timeoutMs - Milliseconds without activity (API calls, command output); 0: no timeout.
   * @param opts - `onTimeout`: 'kill' or 'pause' (default: the one set before, else 'kill').
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for a negative or non-integer timeout.
   * @throws {@link IllegalTransitionError} (INVALID_STATE) unless the sandbox is running.
   */
  async setTimeout(timeoutMs: number, opts: { onTimeout?: OnTimeout } = {}): Promise<void> {
    checkSetTimeout(timeoutMs, opts);
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

  /**
   * What a sandbox is and where it stands, from its directory (any process may ask). A sandbox
   * recorded as live whose owner died is reported `paused` (connect recovers it).
   *
   * @param sandboxId - The sandbox's id.
   * @throws {@link SandboxNotFoundError} (SANDBOX_NOT_FOUND) when there is no such sandbox.
   */
  static async getInfo(sandboxId: string): Promise<SandboxInfo> {
    checkSandboxId(sandboxId);
    const mine = liveSandbox(sandboxId);
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
    const info = infoOf(this.#meta, this.#life.state, running ? process.pid : null, this.#meta.generation ?? 0, await this.#dir.bytesOnDisk());
    const endAt = this.#idle?.deadline;
    if (endAt) info.endAt = endAt;
    return info;
  }

  /**
   * Removes a sandbox that no live process runs (paused, or its owner dead): its files are
   * deleted. SANDBOX_BUSY when a live process owns it (kill it there). Resolves false when there
   * was no such sandbox.
   *
   * @param sandboxId - The sandbox's id.
   * @returns true when a sandbox was removed, false when there was none.
   * @throws {@link SandboxBusyError} (SANDBOX_BUSY) when another live process runs it.
   */
  static async kill(sandboxId: string): Promise<boolean> {
    checkSandboxId(sandboxId);
    const mine = liveSandbox(sandboxId);
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
    const forkBase = (await dir.readMeta().catch(() => undefined))?.templateBuild;
    try {
      await dir.remove();
    } finally {
      await taken.lock.release();
    }
    if (mine) mine.#markKilled();
    await dropForkBaseIfUnused(forkBase).catch(() => false);
    return true;
  }

  #markKilled(cause: SandboxEventCause = 'call'): void {
    if (this.#life.state !== 'killed') {
      this.#life.to('killed');
      this.emit('killed', { sandboxId: this.sandboxId, cause });
    }
    this.#idle?.stop();
    unregisterRunning(this);
    dropLive(this);
  }

  /**
   * Opt-in: on SIGINT / SIGTERM, pause the running sandboxes, then re-raise the signal.
   *
   * @param opts - `signals` (default SIGINT and SIGTERM); `timeoutMs`, how long the pauses may
   *   take (default 30 s: a pause not done by then is abandoned, the next connect recovers the
   *   sandbox from its last generation).
   * @returns A function that removes the handlers.
   */
  static installSignalHandlers(opts: { signals?: NodeJS.Signals[]; timeoutMs?: number } = {}): () => void {
    return installSignalHandlers(opts);
  }

  /** The guest's recent console output (kernel messages, agent log lines). */
  consoleLog(): string {
    return this.#run ? tailText(this.#run.guest.machine) : '';
  }

  /**
   * '127.0.0.1:<host port>' where the host reaches the guest's TCP `port` (one of
   * `network.ports`). INVALID_ARGUMENT for a port not forwarded; NET_BACKEND if the network
   * backend died; INVALID_STATE unless running. After a pause and connect the host port may
   * differ (a fresh backend binds it again; the same one when it is still free).
   *
   * @param port - The guest's TCP port, as listed in `network.ports`.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for a port not forwarded or a sandbox without network.
   */
  getHost(port: number): string {
    checkInt('port', port, 1, 65535);
    if (!this.#meta.network) throw new InvalidArgumentError('this sandbox has no network (network: false)');
    const network = this.#run?.guest.network;
    if (!network) throw this.#notRunning('getHost()');
    return network.getHost(port);
  }

  /** Stops the machine and deletes the sandbox's files. Idempotent. A paused sandbox is removed
   *  as Sandbox.kill(id) removes it (SANDBOX_BUSY when another process has connected to it). */
  async kill(): Promise<void> {
    return this.#kill('call');
  }

  async #kill(cause: SandboxEventCause): Promise<void> {
    // A pause, checkpoint or fork capture in progress finishes first (never cut off half-way).
    if (this.#pausing) await this.#pausing.catch(() => undefined);
    await this.#op;
    const st = this.#life.state;
    if (st === 'killed') return;
    if (st === 'paused' || (st === 'failed' && !this.#run)) {
      await Sandbox.kill(this.sandboxId);
      this.#markKilled(cause);
      return;
    }
    const run = this.#run;
    this.#run = null;
    this.#markKilled(cause);
    if (!run) return;
    run.guest.machine.captureOnTeardown(null);
    try {
      await run.guest.stop();
    } finally {
      try {
        await this.#dir.remove();
      } finally {
        await run.lock.release();
      }
    }
    // A fork's child was the last to use its fork base: the base goes too.
    await dropForkBaseIfUnused(this.#meta.templateBuild).catch(() => false);
  }

  /** What `await using` does at the end of its scope: kills the sandbox (its files are deleted),
   *  or pauses it when it was created or connected with `onDispose: 'pause'`. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#onDispose === 'pause' && this.#life.state === 'running') await this.pause();
    else if (this.#onDispose === 'kill') await this.kill();
  }

  /** What `await using` does with this sandbox from now on: 'kill' (the default) or 'pause'. */
  set onDispose(what: 'kill' | 'pause') {
    if (what !== 'kill' && what !== 'pause') throw new InvalidArgumentError(`onDispose must be 'kill' or 'pause'; got ${JSON.stringify(what)}`);
    this.#onDispose = what;
  }
  get onDispose(): 'kill' | 'pause' {
    return this.#onDispose;
  }
}

export function tailText(machine: Machine): string {
  return machine.consoleTail().toString('utf8');
}

/** Connect options without the checkpoint (restore() names it itself). */
function withoutCheckpoint(opts: ConnectOpts): ConnectOpts {
  const { checkpoint: _checkpoint, ...rest } = opts;
  return rest;
}
