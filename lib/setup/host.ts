// The kind of KVM host: hardware virtualization or PVM. Setup reports it and
// decides from it whether our own kernel can run Linux guests here.
import { existsSync, readFileSync } from 'node:fs';

import { tryProbeHost } from '../host/probe.js';

import type { HostKind } from '../native-types.js';

export type { HostKind };

export interface HostFacts {
  kind: HostKind;
  /** /dev/kvm exists (setup still builds everything without it). */
  kvm: boolean;
  /** How the kind was decided, for `doctor` and messages. */
  source: 'probe' | 'sysfs';
}

/**
 * The native probe (lib/host/probe.ts) is authoritative when it runs; setup
 * must also work before the addon is built or without access to /dev/kvm, so
 * it falls back to the same facts read from sysfs and /proc: the kvm_pvm
 * module means a PVM host, the vmx/svm CPU flags mean hardware virtualization.
 */
export function detectHost(): HostFacts {
  const probed = tryProbeHost();
  if ('probe' in probed) return { kind: probed.probe.hostKind, kvm: true, source: 'probe' };
  return detectHostFromSysfs();
}

export function detectHostFromSysfs(): HostFacts {
  const kvm = existsSync('/dev/kvm');
  // Only with a /dev/kvm: some providers' kernels carry kvm_pvm's sysfs entry without one
  // (seen on a microVM whose kernel has no KVM), and such a host is no PVM host.
  if (kvm && existsSync('/sys/module/kvm_pvm')) return { kind: 'pvm', kvm, source: 'sysfs' };
  let flags = '';
  try {
    flags = readFileSync('/proc/cpuinfo', 'utf8');
  } catch {
    // not Linux, or no procfs: assume hardware, the common case
  }
  const hardware = /^flags\s*:.*\b(vmx|svm)\b/m.test(flags);
  return { kind: hardware || !kvm ? 'hardware' : 'pvm', kvm, source: 'sysfs' };
}
