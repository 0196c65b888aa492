// The agent requests of a pause and a resume (docs/protocol.md): SYNC before the capture, so a
// boot from that generation's disk holds every file written before the pause; RESUMED right
// after the rendezvous, before any other request, so the guest's clock and RNG are fresh
// before a user command runs.
import { randomBytes } from 'node:crypto';

import type { AgentClient } from '../agent/client.js';
import { FieldWriter } from '../agent/fields.js';
import { FrameType } from '../agent/protocol.js';

/** Bytes of fresh entropy a RESUMED carries (the kernel's CRNG is reseeded from them). */
export const RESUMED_ENTROPY_BYTES = 64;

export async function syncGuest(client: AgentClient, timeoutMs: number): Promise<void> {
  await client.call(FrameType.SYNC, new FieldWriter(), { timeoutMs });
}

/** Sends RESUMED (host wall clock in ns, fresh entropy) when the agent offers it; returns the time sent. */
export async function sendResumed(client: AgentClient, timeoutMs: number): Promise<bigint | null> {
  if (!client.supports('resumed')) return null;
  const timeNs = BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
  await client.call(
    FrameType.RESUMED,
    new FieldWriter().i64('time_ns', timeNs).bytes('entropy', randomBytes(RESUMED_ENTROPY_BYTES)),
    { timeoutMs },
  );
  return timeNs;
}
