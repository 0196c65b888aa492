// The host probe: what this machine's KVM can do and which kind of KVM host
// it is (hardware virtualization or PVM). Used by `torpor doctor` and setup.
import { KvmUnavailableError, TorporError } from '../errors.js';
import { loadNative } from '../native.js';
import type { HostProbe } from '../native-types.js';

export type { HostProbe, HostKind } from '../native-types.js';

/**
 * Probes the KVM device: its API version, capabilities, and whether this host is a hardware or
 * a PVM one.
 *
 * @param devicePath - The KVM device (default /dev/kvm).
 * @throws {@link KvmUnavailableError} (KVM_UNAVAILABLE) with the reason when it cannot be opened or lacks what torpor needs.
 * @throws {@link TorporError} ADDON_LOAD_FAILED when the native addon cannot be loaded.
 */
export function probeHost(devicePath?: string): HostProbe {
  return loadNative().probe(devicePath);
}

/** Like probeHost, but returns the error instead of throwing (for reports). */
export function tryProbeHost(devicePath?: string): { probe: HostProbe } | { error: TorporError } {
  try {
    return { probe: probeHost(devicePath) };
  } catch (err) {
    if (err instanceof TorporError) return { error: err };
    return { error: new KvmUnavailableError(err instanceof Error ? err.message : String(err), { cause: err }) };
  }
}

const KIND_TEXT: Record<string, string> = {
  hardware: 'hardware virtualization (VT-x/AMD-V): any x86-64 kernel with a PVH note boots; torpor builds its own',
  pvm: 'PVM (KVM without hardware virtualization): only a guest kernel built for this host\'s PVM runs at speed (set TORPOR_KERNEL); the test guest runs everywhere',
};

/**
 * A human-readable report of a probe (or of why it failed), as `torpor doctor` prints it.
 *
 * @param result - What probeHost returned, or the error it threw.
 */
export function formatProbe(result: HostProbe | TorporError): string {
  if (result instanceof TorporError) {
    return [`KVM: unavailable (${result.code})`, `  ${result.message}`].join('\n');
  }
  const p = result;
  const lines: string[] = [];
  lines.push(`KVM device:   ${p.device} (API version ${p.apiVersion})`);
  lines.push(`Host kind:    ${p.hostKind} — ${KIND_TEXT[p.hostKind] ?? 'unknown'}`);
  lines.push(`CPU vendor:   ${p.cpuVendor}`);
  const caps = Object.entries(p.capabilities);
  const width = Math.max(...caps.map(([k]) => k.length));
  lines.push('Capabilities:');
  for (const [name, ok] of caps) lines.push(`  ${ok ? '[x]' : '[ ]'} ${name.padEnd(width)}`);
  const values = Object.entries(p.capabilityValues).map(([k, v]) => `${k}=${v}`);
  lines.push(`Limits:       ${values.join(', ')}`);
  lines.push(p.missing.length ? `Missing:      ${p.missing.join(', ')} (torpor cannot run machines here)` : 'Missing:      nothing: machines can run here');
  return lines.join('\n');
}
