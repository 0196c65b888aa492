// How the host learns that a guest's agent is ready and gets its first client: at boot, and
// after a restore (a restored guest prints nothing: its vsock transport was reset, its agent
// still listens). Sandbox.create and Sandbox.connect both come through here, so the
// rendezvous is replaced in one place.
import { TorporError } from '../errors.js';
import { AgentClient } from '../agent/client.js';
import type { Machine } from '../vm/machine.js';

export const AGENT_VSOCK_PORT = 1024;
export const GUEST_CID = 3;
/** What the agent prints on the console once it listens on its vsock port. */
export const READY_LINE = /torpor-agent ready v1 /;

/** A freshly booted guest: waits until its agent is ready, then connects. */
export async function awaitBootedAgent(machine: Machine, timeoutMs: number): Promise<AgentClient> {
  const deadline = Date.now() + timeoutMs;
  try {
    await machine.waitForConsole(READY_LINE, timeoutMs);
  } catch (err) {
    // A guest that stopped (panic=1 reboots, a triple fault) fails the wait at once: say
    // so rather than blaming a timeout that never ran out.
    const st = machine.state;
    const why =
      st === 'stopped' || st === 'failed'
        ? `the guest stopped before its agent reported ready (${err instanceof Error ? err.message : String(err)})`
        : `the guest agent did not report ready within ${timeoutMs} ms`;
    throw new TorporError('BOOT_FAILED', `${why}. Last console output:\n${machine.consoleTail().toString('utf8')}`, { cause: err });
  }
  return connectAgent(machine, deadline);
}

/** A restored guest (running again): its agent was listening when the generation was taken. */
export async function awaitRestoredAgent(machine: Machine, timeoutMs: number): Promise<AgentClient> {
  return connectAgent(machine, Date.now() + timeoutMs);
}

/** Connects to the agent once it printed its readiness line (or once a restored machine runs
 *  again). The line comes after listen(), so the first dial normally succeeds; a guest still
 *  bringing its vsock transport up gets a few more tries, until the deadline (at least a few
 *  seconds). */
export async function connectAgent(machine: Machine, deadline: number): Promise<AgentClient> {
  const until = Math.max(deadline, Date.now() + 5_000);
  for (let attempt = 0; ; attempt++) {
    try {
      return await AgentClient.connect(() => machine.vsockConnect(AGENT_VSOCK_PORT), { reconnect: true });
    } catch (err) {
      const st = machine.state;
      if (Date.now() >= until || st === 'stopped' || st === 'failed') {
        throw new TorporError(
          'BOOT_FAILED',
          `the guest agent reported ready but its vsock port ${AGENT_VSOCK_PORT} did not answer (${attempt + 1} tries): ${err instanceof Error ? err.message : String(err)}`,
          { cause: err },
        );
      }
      await new Promise((r) => setTimeout(r, Math.min(50 * 2 ** attempt, 500)));
    }
  }
}

