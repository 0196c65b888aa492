// Sandbox.create from a warm template (template.ts): the template's generation restored into the
// sandbox's own snapshots/ directory (GuestRun.restore, Machine.restore({ into })), a fresh
// network backend attached before the guest runs, the agent's rendezvous, then RESUMED (host
// clock, fresh entropy: two sandboxes from one template must not share RNG state). A build that
// cannot be restored is replaced once; when that fails too, the caller boots instead (never a
// failed create because of a template).
import { rm } from 'node:fs/promises';

import type { AgentHello } from '../agent/connection.js';
import { TorporError } from '../errors.js';
import type { ResolvedNetwork } from '../net/options.js';
import type { SandboxDir, SandboxMeta } from '../store/sandbox-dir.js';
import type { TemplateRecord } from '../template/record.js';
import { GuestRun, reasonOf } from './guest-run.js';
import { sandboxIdentity } from './identity.js';
import { ensureTemplate, isBrokenTemplate, type TemplateBuild, type TemplateInputs } from './template.js';

/** A guest up and its agent answering: what create turns into a Sandbox. */
export interface Started {
  guest: GuestRun;
  /** Disk layers under the machine's top, as meta.json records them. */
  diskLayers: string[];
  template?: TemplateBuild;
}

/**
 * The sandbox's machine restored from `template` into its snapshots, running: its agent past
 * RESUMED, its network (unless `network` is false) attached and ready. `growBytes`: its disk,
 * larger than the template's (Machine.restore diskBytes); the filesystem on it is the caller's
 * to grow (growRootFs) once the agent answers. `agentHello`: the agent's HELLO when it is known
 * (a fork's child: its parent's; GuestStart.agentHello). On failure whatever it started is stopped and
 * the sandbox's snapshots/ removed.
 */
export async function restoreInto(
  template: TemplateBuild,
  dir: SandboxDir,
  network: ResolvedNetwork | false,
  agentTimeoutMs: number,
  growBytes?: number,
  agentHello?: AgentHello,
): Promise<Started> {
  try {
    const options = { into: dir.snapshots, state: 'paused' as const, ...(growBytes !== undefined ? { diskBytes: [growBytes] } : {}) };
    const start = { network, agentTimeoutMs, identity: sandboxIdentity(dir.id), ...(agentHello ? { agentHello } : {}) };
    const guest = await GuestRun.restore(template.dir, options, start);
    return { guest, diskLayers: [...template.diskLayers], template };
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

/**
 * A sandbox from a user template: its build restored when the sandbox has the template's machine
 * (vCPUs, memory, a network device or none), else `{ reason }`: boot the template's disk.
 */
export async function startFromUserTemplate(
  t: TemplateRecord,
  meta: SandboxMeta,
  dir: SandboxDir,
  netOpts: ResolvedNetwork | false,
  bootMs: number,
  growBytes?: number,
): Promise<{ started: Started } | { reason: string }> {
  const differs: string[] = [];
  if (meta.vcpus !== t.resources.cpu) differs.push(`cpu ${meta.vcpus} (template: ${t.resources.cpu})`);
  if (meta.memoryMiB !== t.resources.memoryMb) differs.push(`memoryMb ${meta.memoryMiB} (template: ${t.resources.memoryMb})`);
  if ((netOpts !== false) !== t.build.net) differs.push(netOpts === false ? 'no network device (the template has one)' : 'a network device (the template has none)');
  if (differs.length) return { reason: `the sandbox's machine differs from template ${t.name}'s: ${differs.join(', ')}; its disk boots instead` };
  const build = { name: t.name, key: '', dir: t.build.dir, diskLayers: [...t.build.diskLayers], mac: t.build.mac };
  try {
    return { started: await restoreInto(build, dir, netOpts, bootMs, growBytes) };
  } catch (err) {
    return { reason: `template ${t.name} did not restore: ${reasonOf(err)}` };
  }
}
