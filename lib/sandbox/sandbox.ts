// Sandbox: a Linux microVM whose guest agent runs commands and moves files.
//
//   await using sbx = await Sandbox.create()
//   const r = await sbx.commands.run(['python3', '-c', 'print(6*7)'])
//
// create(): validate options -> check this host can boot a Linux guest -> ensureArtifacts()
// (kernel, root filesystem with the agent as /usr/sbin/torpor-agent) -> a directory under
// TORPOR_HOME/sandboxes/<id>/ (meta.json, the disk overlay, console.log) -> a Machine with the
// root filesystem as /dev/vda -> the agent's readiness line -> vsock port 1024 -> HELLO.
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { InvalidArgumentError, KvmUnavailableError, TemplateNotFoundError } from '../errors.js';
import type { AgentClient } from '../agent/client.js';
import { homeLayout, torporHome } from '../store/home.js';
import { Machine } from '../vm/machine.js';
import { type NetworkOptions, resolveNetwork } from '../net/options.js';
import { SandboxNetwork } from '../net/sandbox-network.js';
import { createAgentApi } from './agent-api.js';
import { GUEST_CID, awaitBootedAgent } from './readiness.js';
export { GUEST_CID };
import type { Commands } from './commands.js';
import type { Files } from './files.js';
import type { Pty } from './pty.js';
import { checkEnvs, checkInt, checkKnownKeys, checkObject, checkString, fail } from './validate.js';

export interface SandboxOpts {
  /** Template name; only the built-in 'base' exists so far. */
  template?: string;
  /** Default 2. */
  vcpus?: number;
  /** Default 512. */
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
    /** How long to wait for the agent's readiness line (default 30 s; a PVM host is slower). */
    timeoutMs?: number;
  };
  /** Kill the sandbox after this long (default: never). */
  timeoutMs?: number;
  /** The guest's network (lib/net/options.ts): egress on, host loopback off by default; false: no network device. */
  network?: NetworkOptions | false;
}

export const GUEST_CMDLINE =
  'console=ttyS0 reboot=k panic=1 pci=off nomodule 8250.nr_uarts=1 i8042.noaux i8042.nomux i8042.dumbkbd ' +
  'acpi=off root=/dev/vda rw init=/usr/sbin/torpor-agent quiet';
export { AGENT_VSOCK_PORT, READY_LINE, awaitBootedAgent, awaitRestoredAgent, connectAgent } from './readiness.js';

const OPT_KEYS = ['template', 'vcpus', 'memoryMiB', 'envs', 'metadata', 'boot', 'timeoutMs', 'network'] as const;

function validate(opts: SandboxOpts): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, OPT_KEYS);
  checkString('opts.template', opts.template, { nonEmpty: true });
  checkInt('opts.vcpus', opts.vcpus, 1, 64);
  checkInt('opts.memoryMiB', opts.memoryMiB, 64, 256 * 1024);
  checkEnvs('opts.envs', opts.envs);
  checkEnvs('opts.metadata', opts.metadata);
  checkInt('opts.timeoutMs', opts.timeoutMs, 1, 2 ** 31 - 1);
  checkObject('opts.boot', opts.boot);
  checkKnownKeys('opts.boot', opts.boot, ['kernel', 'cmdlineExtra', 'timeoutMs']);
  checkString('opts.boot.kernel', opts.boot?.kernel, { nonEmpty: true });
  checkString('opts.boot.cmdlineExtra', opts.boot?.cmdlineExtra);
  checkInt('opts.boot.timeoutMs', opts.boot?.timeoutMs, 1, 2 ** 31 - 1);
  if (opts.boot?.kernel !== undefined && !existsSync(opts.boot.kernel)) fail('opts.boot.kernel', 'an existing file', opts.boot.kernel);
  resolveNetwork('opts.network', opts.network);
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

export class Sandbox implements AsyncDisposable {
  readonly id: string;
  readonly commands: Commands;
  readonly files: Files;
  readonly pty: Pty;
  private killed = false;
  private lifetimeTimer: NodeJS.Timeout | undefined;
  private network: SandboxNetwork | undefined;

  private constructor(
    id: string,
    private readonly dir: string,
    private readonly machine: Machine,
    private readonly client: AgentClient,
    envs: Record<string, string> | undefined,
  ) {
    this.id = id;
    const api = createAgentApi(() => this.client, envs ? { envs } : {});
    this.commands = api.commands;
    this.files = api.files;
    this.pty = api.pty;
    // A guest that stops by itself (panic, reset, poweroff) takes the agent with it: end the
    // session now rather than letting requests wait for reconnects that cannot succeed.
    machine.once('exit', () => {
      if (!this.killed) void this.client.close();
    });
  }

  static async create(opts: SandboxOpts = {}): Promise<Sandbox> {
    validate(opts);
    const template = opts.template ?? 'base';
    if (template !== 'base') {
      throw new TemplateNotFoundError(`no template named ${JSON.stringify(template)}; only 'base' exists so far`);
    }
    const support = await linuxGuestSupport(opts.boot?.kernel);
    if (!support.ok) throw new KvmUnavailableError(`cannot start a Linux sandbox on this host: ${support.reason}`);

    const artifacts = await sharedArtifacts(opts.boot?.kernel);
    if (!artifacts.linuxBootable) {
      throw new KvmUnavailableError(`cannot start a Linux sandbox on this host: ${artifacts.notes.join(' ')}`);
    }

    const id = `sbx_${randomBytes(8).toString('hex')}`;
    const dir = join(homeLayout(torporHome()).sandboxes, id);
    const meta = {
      id,
      template,
      createdAt: new Date().toISOString(),
      vcpus: opts.vcpus ?? 2,
      memoryMiB: opts.memoryMiB ?? 512,
      metadata: opts.metadata ?? {},
      envs: opts.envs ?? {},
      kernel: artifacts.kernel,
      rootfs: artifacts.rootfs,
      ownerPid: process.pid,
      state: 'starting',
    };

    // Every failure from here on stops what was started and removes the sandbox's directory.
    let machine: Machine | undefined;
    let client: AgentClient | undefined;
    let network: SandboxNetwork | undefined;
    const netOpts = resolveNetwork('opts.network', opts.network);
    const netMachine = netOpts ? SandboxNetwork.machineOptions(id) : undefined;
    // passt starts while the machine is built; its failure is handled below, with the rest.
    const netReady = netOpts ? SandboxNetwork.prepare(netOpts) : undefined;
    netReady?.catch(() => undefined);
    try {
      await mkdir(dir, { recursive: true });
      await writeMeta(dir, meta);
      // Built on the thread pool: the kernel file and KVM's VM setup never block the JS thread.
      const cmdline = [GUEST_CMDLINE, opts.boot?.cmdlineExtra, netMachine?.cmdline].filter(Boolean).join(' ');
      machine = await Machine.build({
        kernel: artifacts.kernel,
        cmdline,
        vcpus: meta.vcpus,
        memoryMiB: meta.memoryMiB,
        disks: [{ base: artifacts.rootfs, overlay: join(dir, 'overlay') }],
        vsockCid: GUEST_CID,
        consoleLog: join(dir, 'console.log'),
        ...(netMachine ? { net: netMachine.net } : {}),
      });
      if (netReady) {
        network = await netReady;
        network.attach(machine);
      }
      await machine.start();
      client = await awaitBootedAgent(machine, opts.boot?.timeoutMs ?? 30_000);
      const sbx = new Sandbox(id, dir, machine, client, opts.envs);
      sbx.network = network;
      await writeMeta(dir, { ...meta, state: 'running' });
      if (opts.timeoutMs) {
        sbx.lifetimeTimer = setTimeout(() => void sbx.kill().catch(() => undefined), opts.timeoutMs);
        sbx.lifetimeTimer.unref();
      }
      return sbx;
    } catch (err) {
      // The client first: with reconnect on, a client left open would keep dialling a stopped machine.
      await client?.close().catch(() => undefined);
      await machine?.stop().catch(() => undefined);
      await (network ?? (await netReady?.catch(() => undefined)))?.stop().catch(() => undefined);
      await rm(dir, { recursive: true, force: true }).catch(() => undefined);
      throw err;
    }
  }

  /** The guest's recent console output (kernel messages, agent log lines). */
  consoleLog(): string {
    return tailText(this.machine);
  }

  /**
   * '127.0.0.1:<host port>' where the host reaches the guest's TCP `port` (one of
   * `network.ports`). INVALID_ARGUMENT for a port not forwarded; NET_BACKEND if the network
   * backend died.
   */
  getHost(port: number): string {
    checkInt('port', port, 1, 65535);
    if (!this.network) throw new InvalidArgumentError('this sandbox has no network (network: false)');
    return this.network.getHost(port);
  }

  /** Stops the machine and deletes the sandbox's files. Idempotent. */
  async kill(): Promise<void> {
    if (this.killed) return;
    this.killed = true;
    if (this.lifetimeTimer) clearTimeout(this.lifetimeTimer);
    try {
      await this.client.close();
      await this.machine.stop();
    } finally {
      await this.network?.stop().catch(() => undefined);
      await rm(this.dir, { recursive: true, force: true });
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }
}

export function tailText(machine: Machine): string {
  return machine.consoleTail().toString('utf8');
}

/** Concurrent creates (8 sandboxes at once) share one ensureArtifacts() call instead of racing
 *  to check or build the same store entries. */
const inFlight = new Map<string, ReturnType<typeof ensureArtifactsOnce>>();
function ensureArtifactsOnce(kernel: string | undefined) {
  return import('../setup/artifacts.js').then(({ ensureArtifacts }) => ensureArtifacts(kernel ? { kernel } : {}));
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

async function sharedArtifacts(kernel: string | undefined): Promise<Resolved> {
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

async function writeMeta(dir: string, meta: object): Promise<void> {
  const tmp = join(dir, `meta.json.${process.pid}.tmp`);
  await writeFile(tmp, JSON.stringify(meta, null, 2) + '\n');
  await rename(tmp, join(dir, 'meta.json'));
}
