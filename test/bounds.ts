// Wait bounds for tests that wait on a guest. Inside the nested KVM host
// (TORPOR_NESTED=1, set by test/nested/run.ts) everything runs under QEMU's
// emulator: the guest, its nested page faults, the VMM and Node itself, several
// times slower than on a real host and more so when that host is loaded. A bound
// chosen to cover a real host's slowest case is scaled there, so that a slow
// emulated run is not mistaken for a hang; what the test asserts stays the same.
// These are limits, never performance targets (those live in bench/).

/** True inside the nested KVM host. */
export const NESTED = process.env.TORPOR_NESTED === '1';

/** How much longer a wait may take in the nested host (120 s for a real host's 30 s). */
export const NESTED_FACTOR = 4;

/** A wait bound in ms: `ms` on a real host, NESTED_FACTOR times that in the nested host. */
export function bound(ms: number): number {
  return NESTED ? ms * NESTED_FACTOR : ms;
}
