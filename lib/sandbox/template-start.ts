// Sandbox.create from a warm template (template.ts): the template's generation restored into the
// sandbox's own snapshots/ directory (Machine.restore({ into })), a fresh network backend
// attached before the guest runs, the agent's rendezvous, then RESUMED (host clock, fresh
// entropy: two sandboxes from one template must not share RNG state). A build that cannot be
// restored is replaced once; when that fails too, the caller boots instead (never a failed
// create because of a template).
import { rm } from 'node:fs/promises';

import type { AgentClient } from '../agent/client.js';
import { TorporError } from '../errors.js';
import type { ResolvedNetwork } from '../net/options.js';
import { SandboxNetwork } from '../net/sandbox-network.js';
import type { SandboxDir } from '../store/sandbox-dir.js';
import { Machine } from '../vm/machine.js';
import { sendResumed } from './guest-requests.js';
import { awaitRestoredAgent } from './readiness.js';
import { RESUMED_TIMEOUT_MS } from './resume.js';
import { ensureTemplate, isBrokenTemplate, type TemplateBuild, type TemplateInputs } from './template.js';

/** A machine up and its agent answering: what create turns into a Sandbox. */
export interface Started {
  machine: Machine;
  client: AgentClient;
  network?: SandboxNetwork;
  /** Disk layers under the machine's top, as meta.json records them. */
  diskLayers: string[];
  template?: TemplateBuild;
}

/** Why a template was not used, in a few words for meta.json and getInfo(). */
function reasonOf(err: unknown): string {
  if (err instanceof TorporError) return `${err.code}: ${err.message.split('\n')[0]}`;
  return err instanceof Error ? err.message : String(err);
}

/**
 * A machine restored from `templateDir` into `into`, running: its agent past RESUMED, its network
 * (unless `network` is false) attached and ready. `growBytes`: its disk, larger than the
 * template's (Machine.restore diskBytes); the filesystem on it is the caller's to grow
 * (growRootFs) once the agent answers. On failure whatever it started is stopped; `into` is the
 * caller's to remove. A sandbox's start and a template build's steps both begin here.
 */
export async function restoreRunning(
  templateDir: string,
  into: string,
  network: ResolvedNetwork | false,
  agentTimeoutMs: number,
  growBytes?: number,
): Promise<{ machine: Machine; client: AgentClient; network?: SandboxNetwork }> {
  const netReady = network ? SandboxNetwork.prepare(network) : undefined;
  netReady?.catch(() => undefined);
  let machine: Machine | undefined;
  let client: AgentClient | undefined;
  let net: SandboxNetwork | undefined;
  try {
    machine = await Machine.restore(templateDir, { into, state: 'paused', ...(growBytes !== undefined ? { diskBytes: [growBytes] } : {}) });
    if (netReady) {
      net = await netReady;
      net.attach(machine);
    }
    await machine.resume();
    client = await awaitRestoredAgent(machine, agentTimeoutMs);
    await sendResumed(client, RESUMED_TIMEOUT_MS);
    await net?.ready();
    return { machine, client, ...(net ? { network: net } : {}) };
  } catch (err) {
    await client?.close().catch(() => undefined);
    await machine?.stop().catch(() => undefined);
    await (net ?? (await netReady?.catch(() => undefined)))?.stop().catch(() => undefined);
    throw err;
  }
}

/** The sandbox's machine restored from `template` into its snapshots (restoreRunning). */
export async function restoreInto(
  template: TemplateBuild,
  dir: SandboxDir,
  network: ResolvedNetwork | false,
  agentTimeoutMs: number,
  growBytes?: number,
): Promise<Started> {
  try {
    const r = await restoreRunning(template.dir, dir.snapshots, network, agentTimeoutMs, growBytes);
    return { ...r, diskLayers: [...template.diskLayers], template };
  } catch (err) {
    // The restored machine's disk top: nothing else was written into the sandbox's snapshots yet.
    await rm(dir.snapshots, { recursive: true, force: true }).catch(() => undefined);
    throw err;
  }
}

/**
 * The sandbox's machine from the template for `inputs` (built first when there is none), or the
 * reason it could not be: `{ reason }` means "boot instead". A guest that does not boot while
 * the template is built fails the create as a boot would (BOOT_FAILED), without a second boot.
 */
export async function startFromTemplate(
  inputs: TemplateInputs,
  dir: SandboxDir,
  network: ResolvedNetwork | false,
  timeouts: { bootMs: number; agentMs: number },
  growBytes?: number,
): Promise<{ started: Started } | { reason: string }> {
  let template: TemplateBuild;
  try {
    template = (await ensureTemplate(inputs, { bootTimeoutMs: timeouts.bootMs })).template;
  } catch (err) {
    if (err instanceof TorporError && err.code === 'BOOT_FAILED') throw err;
    return { reason: `template ${inputs.name} could not be built: ${reasonOf(err)}` };
  }
  try {
    return { started: await restoreInto(template, dir, network, timeouts.agentMs, growBytes) };
  } catch (err) {
    if (!isBrokenTemplate(err)) return { reason: `template ${inputs.name} did not restore: ${reasonOf(err)}` };
    const first = reasonOf(err);
    try {
      template = (await ensureTemplate(inputs, { bootTimeoutMs: timeouts.bootMs, replacing: template })).template;
      return { started: await restoreInto(template, dir, network, timeouts.agentMs, growBytes) };
    } catch (again) {
      return { reason: `template ${inputs.name} did not restore (${first}), nor its replacement: ${reasonOf(again)}` };
    }
  }
}
