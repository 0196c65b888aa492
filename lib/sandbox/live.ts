// Who runs a sandbox: this process (the Sandbox objects it holds, by id: connect returns the
// running one as it is, kill and getInfo ask it first), or another one (SANDBOX_BUSY).
import { SandboxBusyError } from '../errors.js';
import type { Sandbox } from './sandbox.js';

/** Sandboxes this process runs or ran, by id. */
const live = new Map<string, Sandbox>();

export function liveSandbox(id: string): Sandbox | undefined {
  return live.get(id);
}

export function addLive(sbx: Sandbox): void {
  live.set(sbx.sandboxId, sbx);
}

/** Forgets `sbx` (not another Sandbox that holds its id since). */
export function dropLive(sbx: Sandbox): void {
  if (live.get(sbx.sandboxId) === sbx) live.delete(sbx.sandboxId);
}

export const SANDBOX_BUSY = (id: string, pid: number | null) =>
  new SandboxBusyError(
    `sandbox ${id} is in use by ${pid ? `process ${pid}` : 'another process'}: pause it there (or end that process), then connect again`,
    { ownerPid: pid },
  );
