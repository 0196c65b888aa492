// A running sandbox whose process ends without a pause (process-exit.ts says when): its machine
// captured synchronously into the next generation, on the JS thread (an `exit` handler), or by
// the addon's cleanup hook when a worker thread ends (no JS runs there). Best effort: a capture
// that fails leaves the sandbox as a dead owner's, and connect restores its last generation.
import { frozenDiskTop, generationDiskLayers } from '../store/generations.js';
import type { SandboxDir, SandboxMeta } from '../store/sandbox-dir.js';
import type { Machine } from '../vm/machine.js';
import type { Running } from './resume.js';

/** How long the capture of an ending process waits for the vCPUs to park. */
const EXIT_CAPTURE_TIMEOUT_MS = 2_000;

/** A worker thread that ends with this machine running: the addon's cleanup hook captures it
 *  into the next generation; connect finds it newer than meta.json says. */
export function captureOnTeardown(machine: Machine, dir: SandboxDir): void {
  machine.captureOnTeardown(dir.snapshots, EXIT_CAPTURE_TIMEOUT_MS);
}

/** Captures `run` now, synchronously (the machine stays paused); returns the sandbox's meta as `paused` at that generation. Throws when the capture fails. */
export function captureNow(dir: SandboxDir, meta: SandboxMeta, run: Running): SandboxMeta {
  const machine = run.guest.machine;
  machine.captureOnTeardown(null);
  const pausedAt = new Date();
  const generation = machine.captureNow(dir.snapshots, EXIT_CAPTURE_TIMEOUT_MS);
  const diskLayers = generationDiskLayers(dir, generation) ?? [...run.diskLayers, frozenDiskTop(generation)];
  return { ...meta, state: 'paused', ownerPid: null, generation, pausedAt: pausedAt.toISOString(), diskLayers };
}
