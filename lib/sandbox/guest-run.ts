// A guest started for a sandbox or a template: its machine, its agent client and its network
// backend, made by one of two starts (in the way of Firecracker's builder: one path for boot
// and restore):
//
//   boot:    the network backend (passt) starts while the machine is built -> attached ->
//            start -> the agent's knock, then HELLO (readiness.ts) [-> RESUMED] -> ports bound
//   restore: the backend starts while the generation is restored, paused -> attached ->
//            resume -> HELLO -> RESUMED (host clock, fresh entropy) -> ports bound; where the
//            agent's HELLO is known (a fork's child), RESUMED is written behind the HELLO
//
// A sandbox's guest (not a template's) gets RESUMED on either start with its identity
// (identity.ts: hostname, machine-id, MAC).
//
// What a start sets up goes on one UndoStack; a start that fails undoes it in reverse order
// (the client, the machine, the backend) and throws, a run that started holds it until stop().
// Who starts a guest: Sandbox.create (create.ts: a cold boot, a template restored into the
// sandbox), Sandbox.connect (resume.ts: from memory, from disk), a warm template's build
// (template.ts) and a user template's steps (lib/template/build.ts).
import type { AgentClient } from '../agent/client.js';
import type { AgentHello } from '../agent/connection.js';
import { TorporError } from '../errors.js';
import type { ResolvedNetwork } from '../net/options.js';
import { SandboxNetwork } from '../net/sandbox-network.js';
import { Machine, type MachineOptions, type RestoreOptions, type SnapshotResult } from '../vm/machine.js';
import { sendResumed } from './guest-requests.js';
import type { GuestIdentity } from './identity.js';
import { awaitBootedAgent, awaitRestoredAgent, beginRestoredAgent } from './readiness.js';
import { UndoStack } from './undo-stack.js';

/** How long RESUMED may take (the guest already answered the rendezvous: generous). */
export const RESUMED_TIMEOUT_MS = 30_000;

export interface GuestStart {
  /** The guest's network: a fresh backend for this run (false or absent: the guest has no network device). */
  network?: ResolvedNetwork | false;
  /** Host ports by guest port to bind again where still free (a resume); the others get free ports. */
  hostPorts?: Record<string, number>;
  /** How long the agent has to answer: its knock and HELLO after a boot, HELLO after a restore. */
  agentTimeoutMs: number;
  /** A boot that continues a sandbox's disk: its agent gets RESUMED too (a restore always sends it). */
  resumed?: boolean;
  /** A sandbox's guest: its identity, sent with RESUMED on either start (a boot too). */
  identity?: GuestIdentity;
  /** A restore whose agent's HELLO is known (a fork's child: its parent's agent): RESUMED goes
   *  out right behind the HELLO instead of a round trip after it (beginRestoredAgent). */
  agentHello?: AgentHello;
}

type AgentStart = (machine: Machine, timeoutMs: number) => Promise<{ client: AgentClient; hello?: Promise<unknown> }>;

export class GuestRun {
  readonly machine: Machine;
  readonly client: AgentClient;
  /** The network backend of this run (a guest started with a network). */
  readonly network: SandboxNetwork | undefined;
  /** What stop() undoes: the client, the machine, the backend. */
  readonly #undo: UndoStack;

  private constructor(machine: Machine, client: AgentClient, network: SandboxNetwork | undefined, undo: UndoStack) {
    this.machine = machine;
    this.client = client;
    this.network = network;
    this.#undo = undo;
  }

  /** Builds and boots a machine (`options`: guestMachineOptions), then waits for its agent's knock. */
  static boot(options: MachineOptions, start: GuestStart): Promise<GuestRun> {
    // Built on the thread pool: the kernel file and KVM's VM setup never block the JS thread.
    return GuestRun.#start(
      start,
      async () => {
        const machine = await Machine.build(options);
        return { machine, run: () => machine.start() };
      },
      async (machine, timeoutMs) => ({ client: await awaitBootedAgent(machine, timeoutMs) }),
      start.resumed === true,
    );
  }

  /**
   * Restores the generation in `from` (`options` as Machine.restore's: `into` a sandbox's own
   * directory, `diskBytes` to grow its disk). With a network the machine is restored paused, so
   * that the guest runs only once the device has its backend.
   */
  static restore(from: string, options: RestoreOptions, start: GuestStart): Promise<GuestRun> {
    const paused = Boolean(start.network) || options.state === 'paused';
    return GuestRun.#start(
      start,
      async () => {
        const machine = await Machine.restore(from, paused ? { ...options, state: 'paused' } : options);
        return { machine, run: async () => (paused ? machine.resume() : undefined) };
      },
      start.agentHello
        ? (machine, timeoutMs) => beginRestoredAgent(machine, timeoutMs, start.agentHello!)
        : async (machine, timeoutMs) => ({ client: await awaitRestoredAgent(machine, timeoutMs) }),
      true,
    );
  }

  static async #start(
    start: GuestStart,
    make: () => Promise<{ machine: Machine; run: () => Promise<void> }>,
    awaitAgent: AgentStart,
    resumed: boolean,
  ): Promise<GuestRun> {
    const undo = new UndoStack();
    // passt starts while the machine is made; its failure is met where it is attached.
    const netReady = start.network ? SandboxNetwork.prepare(start.network, start.hostPorts) : undefined;
    if (netReady) {
      netReady.catch(() => undefined);
      undo.defer(async () => (await netReady.catch(() => undefined))?.stop().catch(() => undefined));
    }
    try {
      const { machine, run } = await make();
      undo.defer(() => machine.stop());
      const network = await netReady;
      network?.attach(machine);
      await run();
      const { client, hello } = await awaitAgent(machine, start.agentTimeoutMs);
      undo.defer(() => client.close());
      // A boot sends RESUMED only to an agent that takes the identity (its clock and RNG are fresh).
      const identity = start.identity && { ...start.identity, mac: start.network ? start.identity.mac : undefined };
      const resuming = resumed || (identity && client.supports('identity')) ? sendResumed(client, RESUMED_TIMEOUT_MS, identity) : undefined;
      // An expected HELLO's answer first: when it fails, RESUMED fails only because of it.
      const [helloDone, resumedDone] = await Promise.allSettled([hello, resuming]);
      if (helloDone.status === 'rejected') throw helloDone.reason;
      if (resumedDone.status === 'rejected') throw resumedDone.reason;
      // The forwarded ports were being bound while the guest came up; getHost is good from here.
      await network?.ready();
      return new GuestRun(machine, client, network, undo.move());
    } catch (err) {
      await undo.disposeAsync().catch(() => undefined);
      throw err;
    }
  }

  /**
   * Ends the run: the client closed, the machine stopped, the backend ended (its failure is
   * not the caller's: the guest is gone either way). Every step runs; the first failure of
   * the others is thrown.
   */
  stop(): Promise<void> {
    return this.#undo.disposeAsync();
  }

  /**
   * Captures the guest into the generation after the last one in `dir` and ends the run: the
   * client closed first (a SYNC, if wanted, is the caller's, before), the machine captured
   * durably and stopped, then the backend ended, and every host-side flow with it. Resolves to
   * what the generation holds. A capture that fails leaves the machine as the failure left it
   * (stop() it, or reattach()).
   */
  async capture(dir: string): Promise<SnapshotResult> {
    await this.client.close();
    const snap = await this.machine.snapshot(dir, { stop: true });
    await this.network?.stop().catch(() => undefined);
    return snap;
  }

  /**
   * The same machine and backend with a new agent client, for a machine that still runs after a
   * capture failed (resumed first if the failure left it paused). Its stop() ends all of it.
   */
  async reattach(agentTimeoutMs: number): Promise<GuestRun> {
    if (this.machine.state === 'paused') await this.machine.resume();
    const client = await awaitRestoredAgent(this.machine, agentTimeoutMs);
    const undo = new UndoStack();
    undo.defer(() => this.stop());
    undo.defer(() => client.close());
    return new GuestRun(this.machine, client, this.network, undo);
  }
}

/** Why a start was not used (a template's, a restore's), in a few words for meta.json and getInfo(). */
export function reasonOf(err: unknown): string {
  if (err instanceof TorporError) return `${err.code}: ${err.message.split('\n')[0]}`;
  return err instanceof Error ? err.message : String(err);
}
