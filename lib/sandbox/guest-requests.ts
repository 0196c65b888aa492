// The agent requests of a pause and a resume (docs/protocol.md): SYNC before the capture, so a
// boot from that generation's disk holds every file written before the pause; RESUMED right
// after the rendezvous, before any other request, so the guest's clock, RNG and identity
// (hostname, machine-id, MAC: identity.ts) are right before a user command runs. GROW_FS after
// a restore into a larger disk.
import type { AgentClient } from '../agent/client.js';
import { InvalidArgumentError, TimeoutError } from '../errors.js';
import { FieldWriter } from '../agent/fields.js';
import { FrameType } from '../agent/protocol.js';
import type { GuestIdentity } from './identity.js';
import { randomBytes } from '../random.js';

/** Bytes of fresh entropy a RESUMED carries (the kernel's CRNG is reseeded from them). */
export const RESUMED_ENTROPY_BYTES = 64;

export async function syncGuest(client: AgentClient, timeoutMs: number): Promise<void> {
  await client.call(FrameType.SYNC, new FieldWriter(), { timeoutMs });
}

/**
 * Sends RESUMED (host wall clock in ns, fresh entropy, and `identity` where the agent takes it:
 * its MAC only where `identity.mac` is given, a guest with a network) when the agent offers it;
 * returns the time sent.
 */
export async function sendResumed(
  client: AgentClient,
  timeoutMs: number,
  identity?: Omit<GuestIdentity, 'mac'> & { mac?: string | undefined },
): Promise<bigint | null> {
  if (!client.supports('resumed')) return null;
  const timeNs = BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
  const fields = new FieldWriter().i64('time_ns', timeNs).bytes('entropy', randomBytes(RESUMED_ENTROPY_BYTES));
  // An agent from before identity (a template built then) would skip the fields unread.
  if (identity && client.supports('identity')) {
    // The agent refuses what does not fit (docs/protocol.md); a malformed one is our bug, said here.
    if (!/^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/.test(identity.hostname) || !/^[0-9a-f]{32}$/.test(identity.machineId) || (identity.mac !== undefined && !/^[0-9a-f]{2}(?::[0-9a-f]{2}){5}$/.test(identity.mac))) {
      throw new InvalidArgumentError(`not a guest identity: ${JSON.stringify(identity)}`);
    }
    fields.str('hostname', identity.hostname).str('machine_id', identity.machineId);
    if (identity.mac) fields.bytes('mac', Buffer.from(identity.mac.replace(/:/g, ''), 'hex'));
  }
  await client.call(FrameType.RESUMED, fields, { timeoutMs });
  return timeNs;
}

/** How long a disk grown on restore may take to show in the guest (its virtio-blk driver reads
 *  the new capacity from a work queue after the config-change interrupt) and its ext4 to grow. */
export const GROW_FS_TIMEOUT_MS = 15_000;

/**
 * Grows the guest's root filesystem online to fill its disk, grown to `diskBytes` on restore or
 * boot (docs/protocol.md, GROW_FS): asks until the guest's block device shows that size (the
 * agent answers at once while it does not), then the agent's EXT4_IOC_RESIZE_FS has run and
 * `df /` shows the grown size. TIMEOUT past `timeoutMs`; REQUEST_FAILED when the agent predates
 * GROW_FS (a template built before it: rebuild the template).
 */
export async function growRootFs(client: AgentClient, diskBytes: number, timeoutMs = GROW_FS_TIMEOUT_MS): Promise<{ deviceBytes: number; fsBytes: number }> {
  client.requireFeature('grow_fs');
  const deadline = Date.now() + timeoutMs;
  for (let wait = 2; ; wait = Math.min(wait * 2, 50)) {
    const answer = await client.call(FrameType.GROW_FS, new FieldWriter().str('path', '/').u64('size', BigInt(diskBytes)), {
      timeoutMs: Math.max(1000, deadline - Date.now()),
    });
    const deviceBytes = answer.u64n('size') ?? 0;
    const fsBytes = answer.u64n('fs_size') ?? 0;
    if (deviceBytes >= diskBytes) return { deviceBytes, fsBytes };
    if (Date.now() + wait > deadline) {
      throw new TimeoutError(`the guest's disk did not grow to ${diskBytes} bytes within ${timeoutMs} ms (it shows ${deviceBytes})`);
    }
    await new Promise((r) => setTimeout(r, wait));
  }
}
