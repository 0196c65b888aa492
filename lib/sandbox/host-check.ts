// Whether this host can boot a Linux guest (Sandbox.create and Template.build ask first, so a
// host without KVM, or a PVM host without a kernel for it, is refused with what to do).
import { readFile } from 'node:fs/promises';

import { homeLayout, torporHome } from '../store/home.js';

/**
 * Whether this host can boot a Linux guest, and if not, exactly why and what to do
 * (Sandbox.create and Template.build ask the same and refuse with KVM_UNAVAILABLE).
 *
 * @param kernelOverride - A guest kernel to boot instead of the stored one (a PVM host needs one).
 * @returns `{ ok: true }`, or `{ ok: false, reason }` with the reason and the fix in words.
 */
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
