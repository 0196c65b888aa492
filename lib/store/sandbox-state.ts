// The states a sandbox can be in, as meta.json records them. Below lib/sandbox so the store can
// check a meta.json's state; which state may follow which is lib/sandbox/lifecycle.ts's.
/**
 * A sandbox's state: `starting` -> `running` <-> `pausing` -> `paused` -> `resuming` -> `running`;
 * any live state -> `killed`; `failed` when its machine ended by itself or a start, pause or
 * resume failed half-way (kill it). docs/sandbox-lifecycle.md has the whole table.
 */
export type SandboxState = 'starting' | 'running' | 'pausing' | 'paused' | 'resuming' | 'killed' | 'failed';

export const SANDBOX_STATES: readonly SandboxState[] = ['starting', 'running', 'pausing', 'paused', 'resuming', 'killed', 'failed'];

export function isSandboxState(v: unknown): v is SandboxState {
  return typeof v === 'string' && (SANDBOX_STATES as readonly string[]).includes(v);
}
