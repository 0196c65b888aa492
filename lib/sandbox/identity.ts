// A sandbox's own identity in its guest: a hostname, an /etc/machine-id and the MAC of its
// network interface, all derived from the sandbox id, so that they are stable for the
// sandbox's life (a paused and connected sandbox, or one booted from its disk, keeps them) and
// differ between sandboxes: two sandboxes from one template, or the children of one fork,
// start from one snapshot, and without this would share the snapshot's. The agent applies them
// on RESUMED (guest/agent/src/identity.c), which every start of a sandbox sends.
import { createHash } from 'node:crypto';

import { macFor } from '../net/options.js';

export interface GuestIdentity {
  /** The guest's hostname: the sandbox id with '-' for '_' ('sbx-0123456789abcdef'). */
  hostname: string;
  /** /etc/machine-id: 32 hex digits. */
  machineId: string;
  /** The network interface's MAC (macFor: locally administered, unicast). */
  mac: string;
}

export function sandboxIdentity(sandboxId: string): GuestIdentity {
  const machineId = createHash('sha256').update(`torpor-machine-id\0${sandboxId}`).digest('hex').slice(0, 32);
  return { hostname: sandboxId.replace(/_/g, '-'), machineId, mac: macFor(sandboxId) };
}
