// A sandbox's network for one run of its machine: the virtio-net device's backend (passt, on
// a socketpair) and the forwarded ports. prepare() starts passt before the machine exists, so
// its start overlaps Machine.build (or Machine.restore); attach() hands the machine its end
// before it runs; ready() waits for the forwarded ports while the guest already runs (frames
// wait in the socket meanwhile); stop() ends passt with the machine. Across pause and connect (lib/sandbox/resume.ts): stop() after
// the capture, prepare() + attach() again on connect with the same MAC (the sandbox's, which
// RESUMED gives the guest's interface: lib/sandbox/identity.ts), addresses and, where still
// free, the same host ports.
import { TorporError } from '../errors.js';
import { Machine } from '../vm/machine.js';
import { GUEST_NET, type ResolvedNetwork, macFor, netCmdline } from './options.js';
import { Passt, portIsFree } from './passt.js';

export class SandboxNetwork {
  #passt: Passt;
  #network: ResolvedNetwork;
  #machineEnd: number | undefined;
  #failure: TorporError | undefined;
  #onFailure: ((err: TorporError) => void) | undefined;

  private constructor(passt: Passt, network: ResolvedNetwork, machineEnd: number) {
    this.#passt = passt;
    this.#network = network;
    this.#machineEnd = machineEnd;
    passt.onUnexpectedExit((err) => {
      this.#failure = err;
      this.#onFailure?.(err);
    });
  }

  /** What Machine.build needs for this sandbox: the device (its MAC) and the agent's cmdline entry. */
  static machineOptions(sandboxId: string): { net: { mac: string }; cmdline: string } {
    return { net: { mac: macFor(sandboxId) }, cmdline: netCmdline() };
  }

  /**
   * Starts the backend on a new socketpair, before the machine exists (or before a restored one
   * runs); resolves once passt is spawned, not yet serving (ready()). `preferred`: host ports by
   * guest port to bind again where still free (a resume); the others get free ports.
   * NET_BACKEND on failure.
   */
  static async prepare(network: ResolvedNetwork, preferred?: Record<string, number>): Promise<SandboxNetwork> {
    const hostPorts = new Map<number, number>();
    for (const guest of network.ports) {
      const host = preferred?.[String(guest)];
      if (host !== undefined && (await portIsFree(host))) hostPorts.set(guest, host);
    }
    const [machineEnd, passtEnd] = Machine.netSocketPair();
    try {
      const passt = await Passt.spawn({ fd: passtEnd, network, hostPorts });
      return new SandboxNetwork(passt, network, machineEnd);
    } catch (err) {
      Machine.closeNetSocket(machineEnd);
      throw err;
    }
  }

  /** Connects `machine` (built with machineOptions, not yet running) to the backend: the egress policy first. */
  attach(machine: Machine): void {
    if (this.#machineEnd === undefined) throw new TorporError('INVALID_STATE', 'this network was attached or stopped already');
    machine.netEgressPolicy({
      egress: this.#network.egress,
      guestPorts: this.#network.ports,
      allowIpv4: this.#network.allowHostLoopback ? [GUEST_NET.gateway] : [],
    });
    const fd = this.#machineEnd;
    this.#machineEnd = undefined;
    machine.netAttachFd(fd);
  }

  /** Resolves once passt serves (its forwarded ports bound); NET_BACKEND (passt stopped) if it does not. */
  ready(): Promise<void> {
    return this.#passt.ready();
  }

  /** '127.0.0.1:<host port>' for a forwarded guest port. */
  getHost(port: number): string {
    const host = this.#passt.hostPorts.get(port);
    if (host === undefined) {
      throw new TorporError('INVALID_ARGUMENT', `guest port ${port} is not forwarded; forwarded: ${[...this.#passt.hostPorts.keys()].join(', ') || 'none'} (network: { ports: [...] })`);
    }
    if (this.#failure) throw this.#failure;
    return `127.0.0.1:${host}`;
  }

  /** The forwarded host ports by guest port, for meta.json (the next resume asks for them again). */
  hostPortsRecord(): Record<string, number> {
    return Object.fromEntries([...this.#passt.hostPorts].map(([guest, host]) => [String(guest), host]));
  }

  /** Called once if the backend ends on its own (crashed, killed): the guest's network is gone
   *  until the next connect starts a new one. Not called for stop(). */
  onFailure(fn: (err: TorporError) => void): void {
    this.#onFailure = fn;
    if (this.#failure) fn(this.#failure);
  }

  /** The backend's failure, if it ended on its own. */
  get failure(): TorporError | undefined {
    return this.#failure;
  }

  /** The backend process's resident memory (bytes). */
  rssBytes(): Promise<number | undefined> {
    return this.#passt.rssBytes();
  }

  /** Ends the backend (every flow with it). Idempotent. */
  async stop(): Promise<void> {
    if (this.#machineEnd !== undefined) {
      Machine.closeNetSocket(this.#machineEnd);
      this.#machineEnd = undefined;
    }
    await this.#passt.stop();
  }
}
