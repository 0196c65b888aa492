// A sandbox's network: what the user asks for (NetworkOptions), checked, with the defaults
// spelled out, and the addressing every sandbox gets. The addresses are fixed and private to
// the sandbox (its own backend process answers for the gateway and DNS), so a guest keeps
// them across pause and resume and the kernel command line can carry them: the agent
// configures the interface before serving, no DHCP exchange on the boot path.
import { createHash } from 'node:crypto';

import { checkBool, checkKnownKeys, checkObject, fail } from '../validate.js';

/** A sandbox's network, as {@link SandboxOpts.network} takes it (docs/network.md). Every field is optional. */
export interface NetworkOptions {
  /**
   * Whether the guest may open connections to the outside world (default true). Off: only the
   * traffic of forwarded ports (and of the host loopback mapping, when allowed) gets through.
   */
  egress?: boolean;
  /**
   * Maps the host's loopback into the guest at the gateway address (10.0.2.2): a guest connecting
   * to 10.0.2.2:PORT reaches the host's 127.0.0.1:PORT. Off by default: services the host binds to
   * 127.0.0.1 are not the guest's business.
   */
  allowHostLoopback?: boolean;
  /** Guest TCP ports reachable from the host through 127.0.0.1:<host port> (sbx.getHost(port)). */
  ports?: number[];
}

/** NetworkOptions with every default applied. */
export interface ResolvedNetwork {
  egress: boolean;
  allowHostLoopback: boolean;
  ports: number[];
}

/** The guest's side of the link: fixed for every sandbox (each has its own backend). */
export const GUEST_NET = {
  address: '10.0.2.15',
  prefix: 24,
  gateway: '10.0.2.2',
  dns: '10.0.2.3',
} as const;

const KEYS = ['egress', 'allowHostLoopback', 'ports'] as const;
const MAX_PORTS = 64;

/** Checks `network` (an object, or false for no network device at all). */
export function resolveNetwork(what: string, value: unknown): ResolvedNetwork | false {
  if (value === false) return false;
  checkObject(what, value);
  const opts = (value ?? {}) as NetworkOptions;
  checkKnownKeys(what, opts, KEYS);
  checkBool(`${what}.egress`, opts.egress);
  checkBool(`${what}.allowHostLoopback`, opts.allowHostLoopback);
  const ports: number[] = [];
  if (opts.ports !== undefined) {
    if (!Array.isArray(opts.ports)) fail(`${what}.ports`, 'an array of TCP port numbers', opts.ports);
    if (opts.ports.length > MAX_PORTS) fail(`${what}.ports`, `at most ${MAX_PORTS} ports`, opts.ports.length);
    for (const p of opts.ports) {
      if (typeof p !== 'number' || !Number.isInteger(p) || p < 1 || p > 65535) fail(`${what}.ports[]`, 'a port from 1 to 65535', p);
      if (!ports.includes(p)) ports.push(p);
    }
  }
  return { egress: opts.egress ?? true, allowHostLoopback: opts.allowHostLoopback ?? false, ports };
}

/**
 * The guest's MAC, derived from the sandbox id: stable for the sandbox's life (a resumed or
 * reconnected sandbox keeps it), distinct between sandboxes. Locally administered, unicast.
 */
export function macFor(seed: string): string {
  const h = createHash('sha256').update(`torpor-mac\0${seed}`).digest();
  const bytes = [0x02, h[0]!, h[1]!, h[2]!, h[3]!, h[4]!];
  return bytes.map((b) => b.toString(16).padStart(2, '0')).join(':');
}

/** The kernel command line entry the agent reads (guest/agent/src/netcfg.h). */
export function netCmdline(): string {
  return `torpor.net=${GUEST_NET.address}/${GUEST_NET.prefix},${GUEST_NET.gateway},${GUEST_NET.dns}`;
}
