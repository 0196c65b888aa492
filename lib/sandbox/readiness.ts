// How the host learns that a guest's agent is ready and gets its first client: at boot, and
// after a restore. Sandbox.create and Sandbox.connect both come through here, so the
// rendezvous is replaced in one place. Over vsock only, event-driven (docs/protocol.md, "The
// knock"): no console line is read and no connect is retried.
//
// - Boot: once the agent listens on vsock port 1024 it knocks, a guest-initiated connection
//   request to the host's port 1023 that the VMM counts and refuses (a 'vsockKnock' event, the
//   count latched). The host waits for it, then connects once.
// - Restore: the agent was listening when the generation was taken. The restored machine's
//   vsock device holds the host's connection request until the guest's driver has handled the
//   transport reset (native/devices/virtio/vsock/README.md), so one connect is enough.
import { GuestUnresponsiveError, TorporError } from '../errors.js';
import { AgentClient, type AgentClientOptions, type Dial } from '../agent/client.js';
import type { AgentHello } from '../agent/connection.js';
import type { Machine, MachineDisk, MachineOptions } from '../vm/machine.js';

export const AGENT_VSOCK_PORT = 1024;
/** The host port the agent knocks on once it listens (docs/protocol.md); give it to the machine as a knock port. */
export const AGENT_KNOCK_PORT = 1023;
export const GUEST_CID = 3;

/** The kernel command line of a sandbox's guest: the root filesystem as /dev/vda, the agent as init. */
export const GUEST_CMDLINE =
  'console=ttyS0 reboot=k panic=1 pci=off nomodule 8250.nr_uarts=1 i8042.noaux i8042.nomux i8042.dumbkbd ' +
  'acpi=off root=/dev/vda rw rootflags=noinit_itable init=/usr/sbin/torpor-agent quiet';

/** What a sandbox's guest is booted with (a sandbox's meta.json, a template's inputs). */
export interface GuestSpec {
  kernel: string;
  cmdline: string;
  vcpus: number;
  memoryMiB: number;
}

/**
 * Machine.build's options for a sandbox guest whose agent awaitBootedAgent waits for: its vsock
 * CID and the knock port, over `spec`, with its one disk and the rest (console log, network).
 * One recipe for every path that boots one: a create, a template's build, a boot from disk.
 */
export function guestMachineOptions(spec: GuestSpec, disk: MachineDisk, extra: Pick<MachineOptions, 'consoleLog' | 'net'> = {}): MachineOptions {
  return {
    kernel: spec.kernel,
    cmdline: spec.cmdline,
    vcpus: spec.vcpus,
    memoryMiB: spec.memoryMiB,
    disks: [disk],
    vsockCid: GUEST_CID,
    vsockKnockPorts: [AGENT_KNOCK_PORT],
    ...extra,
  };
}

/** A freshly booted guest (started with vsockKnockPorts: [AGENT_KNOCK_PORT]): waits for the agent's knock, then connects. */
export async function awaitBootedAgent(machine: Machine, timeoutMs: number): Promise<AgentClient> {
  const deadline = Date.now() + timeoutMs;
  await awaitKnock(machine, timeoutMs);
  try {
    return await connectOnce(machine, Math.max(1, deadline - Date.now()));
  } catch (err) {
    throw new TorporError(
      'BOOT_FAILED',
      `the guest agent knocked but its vsock port ${AGENT_VSOCK_PORT} did not answer: ${err instanceof Error ? err.message : String(err)}`,
      { cause: err },
    );
  }
}

/** A restored guest (running again): its agent was listening when the generation was taken. */
export async function awaitRestoredAgent(machine: Machine, timeoutMs: number): Promise<AgentClient> {
  try {
    return await connectOnce(machine, timeoutMs);
  } catch (err) {
    throw restoredAgentFailure(machine, timeoutMs, err);
  }
}

/**
 * awaitRestoredAgent for a guest whose agent's HELLO is known (`expected`: a fork's child runs
 * its parent's agent): the client takes requests once connected, ahead of the HELLO answer
 * (AgentClient.connectExpecting); `hello` rejects as awaitRestoredAgent would, or with
 * PROTOCOL_ERROR for another agent than expected.
 */
export async function beginRestoredAgent(
  machine: Machine,
  timeoutMs: number,
  expected: AgentHello,
): Promise<{ client: AgentClient; hello: Promise<unknown> }> {
  try {
    const { dial, opts } = agentDial(machine, timeoutMs);
    const { client, hello } = await AgentClient.connectExpecting(dial, expected, opts);
    const checked = hello.catch((err: unknown) => {
      throw err instanceof TorporError && err.code === 'PROTOCOL_ERROR' ? err : restoredAgentFailure(machine, timeoutMs, err);
    });
    checked.catch(() => undefined);
    return { client, hello: checked };
  } catch (err) {
    throw restoredAgentFailure(machine, timeoutMs, err);
  }
}

function restoredAgentFailure(machine: Machine, timeoutMs: number, err: unknown): GuestUnresponsiveError {
  const st = machine.state;
  const why = st === 'stopped' || st === 'failed' ? `the restored guest ${st}` : `the restored guest's agent did not answer within ${timeoutMs} ms`;
  return new GuestUnresponsiveError(`${why} (vsock port ${AGENT_VSOCK_PORT}: ${err instanceof Error ? err.message : String(err)})`, { cause: err });
}

/** One vsock connect and the HELLO exchange, each bounded by the caller's timeout; the client redials through the same
 *  path when the connection drops later. The HELLO bound is the caller's too, not the client's 10 s default: a restored
 *  guest's agent answers only once its pages have been faulted back in, which on a loaded or emulated host (the nested
 *  test host) takes longer than on a warm machine, and the caller already said how long it is prepared to wait. */
function connectOnce(machine: Machine, timeoutMs: number): Promise<AgentClient> {
  const { dial, opts } = agentDial(machine, timeoutMs);
  return AgentClient.connect(dial, opts);
}

/** connectOnce's (and beginRestoredAgent's) dial and client options for `timeoutMs`. */
function agentDial(machine: Machine, timeoutMs: number): { dial: Dial; opts: AgentClientOptions } {
  const bound = Math.min(Math.max(1, Math.ceil(timeoutMs)), 3_600_000);
  return { dial: () => machine.vsockConnect(AGENT_VSOCK_PORT, bound), opts: { reconnect: true, helloTimeoutMs: Math.max(10_000, bound) } };
}

/** Resolves at the agent's knock (already counted, or the next one); BOOT_FAILED with the console tail if the
 *  machine stops first or the knock does not come within timeoutMs. */
function awaitKnock(machine: Machine, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const fail = (why: string) => {
      cleanup();
      reject(new TorporError('BOOT_FAILED', `${why}. Last console output:\n${machine.consoleTail().toString('utf8')}`));
    };
    const onKnock = (port: number) => {
      if (port !== AGENT_KNOCK_PORT) return;
      cleanup();
      resolve();
    };
    // A guest that stopped (panic=1 reboots, a triple fault) fails the wait at once: say so
    // rather than blaming a timeout that never ran out.
    const onExit = (state: string, reason: { kind: string; message: string }) =>
      fail(`the guest ${state} before its agent knocked (${reason.kind}: ${reason.message})`);
    const timer = setTimeout(
      () => fail(`the guest agent did not knock on vsock port ${AGENT_KNOCK_PORT} within ${timeoutMs} ms`),
      timeoutMs,
    );
    const cleanup = () => {
      clearTimeout(timer);
      machine.off('vsockKnock', onKnock);
      machine.off('exit', onExit);
    };
    machine.on('vsockKnock', onKnock);
    machine.on('exit', onExit);
    // Latched: a knock that came before we listened counts.
    if (machine.vsockKnocks(AGENT_KNOCK_PORT) > 0) return onKnock(AGENT_KNOCK_PORT);
    const reason = machine.exitReason;
    if (reason) onExit(machine.state, reason);
  });
}
