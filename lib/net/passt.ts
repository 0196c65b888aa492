// passt (https://passt.top), the user-mode network stack behind a sandbox's virtio-net device:
// a separate process that parses the guest's packets (not the user's Node process), drops its
// privileges and sandboxes itself (namespaces, seccomp), and carries the guest's TCP/UDP/ICMP
// flows over ordinary host sockets. No root, no tap device, no host network configuration.
//
// It gets one end of a socketpair (the other is the device's: Machine.netAttachPair) as fd 3
// and speaks QEMU's stream protocol on it; it exits when that socket closes (--one-off), so it
// never outlives the machine, and stop() ends it sooner. It lives as long as one run of the
// machine: a paused sandbox has none, a resumed one gets a fresh process (same addresses, same
// MAC: the guest keeps its identity; every flow of the old process is gone).
import { type ChildProcess, spawn } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { readFile } from 'node:fs/promises';
import net from 'node:net';
import { delimiter, join } from 'node:path';

import { TorporError } from '../errors.js';
import { Machine } from '../vm/machine.js';
import { GUEST_NET, type ResolvedNetwork } from './options.js';

export interface PasstStart {
  /** The socket end passt takes as its fd 3 (closed here once passt has it): an fd from
   *  Machine.netSocketPair() or machine.netAttachPair(), or a connected Unix socket. */
  fd: number | net.Socket;
  network: ResolvedNetwork;
  /** The binary (default: $TORPOR_PASST, else `passt` on PATH). */
  binary?: string;
  /** Host ports to use, by guest port (default: free ports picked now). */
  hostPorts?: Map<number, number>;
}

/** How long passt may take to bind the forwarded ports before start() gives up. */
const READY_TIMEOUT_MS = 5000;

export class Passt {
  /** Host port (on 127.0.0.1) by guest port. */
  readonly hostPorts: ReadonlyMap<number, number>;
  #child: ChildProcess;
  #exit: Promise<void>;
  #exited = false;
  #stderr = '';
  #stopping = false;
  #onUnexpectedExit: ((err: TorporError) => void) | undefined;
  #ready: Promise<void> | undefined;

  private constructor(child: ChildProcess, hostPorts: Map<number, number>) {
    this.#child = child;
    this.hostPorts = hostPorts;
    this.#exit = new Promise((resolve) => {
      child.once('exit', (code, signal) => {
        this.#exited = true;
        if (!this.#stopping) this.#onUnexpectedExit?.(this.#exitError(code, signal));
        resolve();
      });
    });
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (d: string) => {
      this.#stderr = (this.#stderr + d).slice(-4096);
    });
  }

  /** Starts passt on `fd`; resolves once it serves (forwarded ports bound). NET_BACKEND on failure. */
  static async start(opts: PasstStart): Promise<Passt> {
    const p = await Passt.spawn(opts);
    await p.ready();
    return p;
  }

  /**
   * Starts passt on `fd`; resolves once the process exists, before it serves: frames sent on
   * the socket meanwhile wait in the socket buffer. ready() says when the forwarded ports are
   * bound. NET_BACKEND on failure.
   */
  static async spawn(opts: PasstStart): Promise<Passt> {
    const hostPorts = new Map(opts.hostPorts ?? []);
    for (const p of opts.network.ports) if (!hostPorts.has(p)) hostPorts.set(p, await freePort());
    const args = passtArgs(opts.network, hostPorts);
    const binary = opts.binary ?? process.env.TORPOR_PASST ?? 'passt';
    let child: ChildProcess;
    try {
      child = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe', opts.fd], detached: false });
    } finally {
      if (typeof opts.fd === 'number') Machine.closeNetSocket(opts.fd);
      else opts.fd.destroy();
    }
    const p = new Passt(child, hostPorts);
    const spawned = await new Promise<Error | undefined>((resolve) => {
      child.once('spawn', () => resolve(undefined));
      child.once('error', (err) => resolve(err));
    });
    if (spawned) {
      const missing = (spawned as NodeJS.ErrnoException).code === 'ENOENT';
      throw new TorporError(
        'NET_BACKEND',
        missing
          ? `the network backend ${JSON.stringify(binary)} is not installed (Debian: apt-get install passt; or network: false)`
          : `could not start the network backend ${binary}: ${spawned.message}`,
        { cause: spawned },
      );
    }
    child.unref();
    (child.stderr as net.Socket | null)?.unref?.();
    return p;
  }

  /** Resolves once passt serves (forwarded ports bound); NET_BACKEND, passt stopped, if it does not. */
  ready(): Promise<void> {
    this.#ready ??= this.#waitReady().catch(async (err: unknown) => {
      await this.stop();
      throw err;
    });
    return this.#ready;
  }

  /** Called once if passt ends while nobody asked it to (it crashed, or the machine's socket closed). */
  onUnexpectedExit(fn: (err: TorporError) => void): void {
    this.#onUnexpectedExit = fn;
  }

  get pid(): number | undefined {
    return this.#child.pid;
  }
  get exited(): boolean {
    return this.#exited;
  }

  /** Resident memory of the passt process (bytes), from /proc; undefined once it ended. */
  async rssBytes(): Promise<number | undefined> {
    try {
      const status = await readFile(`/proc/${this.#child.pid}/status`, 'utf8');
      const m = /VmRSS:\s+(\d+) kB/.exec(status);
      return m ? Number(m[1]) * 1024 : undefined;
    } catch {
      return undefined;
    }
  }

  /** Ends passt (SIGTERM, then SIGKILL after 2 s) and waits for it. Idempotent. */
  async stop(): Promise<void> {
    this.#stopping = true;
    if (!this.#exited) {
      this.#child.kill('SIGTERM');
      const timer = setTimeout(() => this.#child.kill('SIGKILL'), 2000);
      await this.#exit;
      clearTimeout(timer);
    }
  }

  async #waitReady(): Promise<void> {
    // passt binds the forwarded ports before it serves the socket; until then a connect to a
    // forwarded port would be refused. It prints nothing we could wait on with --quiet, so
    // look for the listening sockets (in our own network namespace: passt binds there).
    const want = [...this.hostPorts.values()];
    const deadline = Date.now() + READY_TIMEOUT_MS;
    for (;;) {
      if (this.#exited) throw this.#exitError(this.#child.exitCode, this.#child.signalCode);
      if (want.length === 0 || (await listening(want))) return;
      if (Date.now() > deadline)
        throw new TorporError('NET_BACKEND', `the network backend did not bind its forwarded ports within ${READY_TIMEOUT_MS} ms; it said: ${this.#stderr.trim() || '(nothing)'}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  #exitError(code: number | null, signal: NodeJS.Signals | null): TorporError {
    const how = signal ? `signal ${signal}` : `status ${code}`;
    const said = this.#stderr.replace(/Failed to send \d+ bytes to syslog\n?/g, '').trim();
    return new TorporError('NET_BACKEND', `the network backend (passt) exited with ${how}${said ? `: ${said.slice(-500)}` : ''}`);
  }
}

/** Where the passt binary is ($TORPOR_PASST, else on PATH), or undefined when there is none (`torpor doctor`). */
export function findPasst(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const candidates = env.TORPOR_PASST ? [env.TORPOR_PASST] : (env.PATH ?? '').split(delimiter).filter(Boolean).map((d) => join(d, 'passt'));
  for (const c of candidates) {
    try {
      accessSync(c, constants.X_OK);
      return c;
    } catch {
      // keep looking
    }
  }
  return undefined;
}

/** passt's command line for one sandbox. */
export function passtArgs(network: ResolvedNetwork, hostPorts: ReadonlyMap<number, number>): string[] {
  const args = [
    '--foreground',
    '--quiet',
    '--stderr',
    '--one-off',
    '--fd', '3',
    '--address', GUEST_NET.address,
    '--netmask', String(GUEST_NET.prefix),
    '--gateway', GUEST_NET.gateway,
    '--dns-forward', GUEST_NET.dns,
    // The guest is configured statically (torpor.net=): no DHCP/NDP/RA answers needed, but
    // harmless; IPv6 stays on for the link-local neighbours passt answers.
  ];
  if (!network.allowHostLoopback) args.push('--no-map-gw');
  if (!network.egress) {
    // No UDP or ICMP at all (DNS included); TCP stays for the forwarded ports, and the
    // device drops every other TCP packet the guest sends (NetPolicy in the native device).
    args.push('--no-udp', '--no-icmp');
  }
  if (hostPorts.size === 0) args.push('--tcp-ports', 'none');
  // One option per port: an address prefix applies to a whole comma-separated spec.
  for (const [guest, host] of hostPorts) args.push('--tcp-ports', `127.0.0.1/${host}:${guest}`);
  if (network.egress) args.push('--udp-ports', 'none');
  return args;
}

/** A TCP port on 127.0.0.1 nobody listens on right now (the kernel's pick). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/** Whether 127.0.0.1:`port` can be bound right now (a resume's backend asks for its old ports again). */
export function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

async function listening(ports: number[]): Promise<boolean> {
  const text = await readFile('/proc/net/tcp', 'utf8').catch(() => '');
  const open = new Set<number>();
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length > 3 && f[3] === '0A') open.add(parseInt(f[1]!.split(':')[1]!, 16));
  }
  return ports.every((p) => open.has(p));
}
