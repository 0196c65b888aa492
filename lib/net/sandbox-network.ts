// A sandbox's network for one run of its machine: the virtio-net device's backend (passt, on
// a socketpair) and the forwarded ports. Started after the machine is built and before it
// runs; stopped with it. Pause/resume (later): stop() on pause, start() again on resume with
// the same MAC, addresses and, where still free, the same host ports.
import { TorporError } from '../errors.js';
import type { Machine } from '../vm/machine.js';
import { GUEST_NET, type ResolvedNetwork, macFor, netCmdline } from './options.js';
import { Passt } from './passt.js';

export class SandboxNetwork {
  #passt: Passt;
  #failure: TorporError | undefined;

  private constructor(passt: Passt) {
    this.#passt = passt;
    passt.onUnexpectedExit((err) => {
      this.#failure = err;
    });
  }

  /** What Machine.build needs for this sandbox: the device (its MAC) and the agent's cmdline entry. */
  static machineOptions(sandboxId: string): { net: { mac: string }; cmdline: string } {
    return { net: { mac: macFor(sandboxId) }, cmdline: netCmdline() };
  }

  /** Starts the backend for `machine` (built with machineOptions, not yet running). NET_BACKEND on failure. */
  static async start(machine: Machine, network: ResolvedNetwork, hostPorts?: Map<number, number>): Promise<SandboxNetwork> {
    // The policy before the backend: no frame of the guest's reaches passt unchecked.
    machine.netEgressPolicy({
      egress: network.egress,
      guestPorts: network.ports,
      allowIpv4: network.allowHostLoopback ? [GUEST_NET.gateway] : [],
    });
    const fd = machine.netAttachPair();
    const passt = await Passt.start({ fd, network, ...(hostPorts ? { hostPorts } : {}) });
    return new SandboxNetwork(passt);
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

  /** The backend's failure, if it ended on its own. */
  get failure(): TorporError | undefined {
    return this.#failure;
  }

  /** The backend process's resident memory (bytes). */
  rssBytes(): Promise<number | undefined> {
    return this.#passt.rssBytes();
  }

  /** Ends the backend (every flow with it). Idempotent. */
  stop(): Promise<void> {
    return this.#passt.stop();
  }
}
