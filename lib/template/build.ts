// Template.build: a template from the base, from another template, or from a container image,
// with steps run in a booted sandbox of it and the result captured (memory and disk), so every
// sandbox from it starts warm with the steps' effects (docs/templates.md).
//
//   from an image:   fetch (lib/image) -> its root filesystem, the agent injected (ext4) ->
//                    the image's automatic warm template (booted once, captured; shared by every
//                    template of that image and those sizes) -> steps -> capture
//   from 'base':     the base's automatic warm template -> steps -> capture
//   from a template: its build -> steps -> capture (its layers stay shared)
//
// A template without steps is its parent's build with a record of its own (defaults, name).
import { createHash } from 'node:crypto';
import { mkdir, rename, rm, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';

import { KvmUnavailableError, TemplateNotFoundError } from '../errors.js';
import { fetchImage } from '../image/index.js';
import { imageRootfs } from '../image/rootfs.js';
import type { ImageProgress, PulledImage } from '../image/types.js';
import { resolveNetwork, type NetworkOptions, type ResolvedNetwork } from '../net/options.js';
import { SandboxNetwork } from '../net/sandbox-network.js';
import { createAgentApi } from '../sandbox/agent-api.js';
import { growRootFs, syncGuest } from '../sandbox/guest-requests.js';
import { sharedArtifacts } from '../sandbox/artifacts-cache.js';
import { GuestRun } from '../sandbox/guest-run.js';
import { linuxGuestSupport } from '../sandbox/host-check.js';
import { GUEST_CMDLINE } from '../sandbox/readiness.js';
import { checkTemplateName, ensureTemplate, freeze, type TemplateBuild, type TemplateInputs } from '../sandbox/template.js';
import { UndoStack } from '../sandbox/undo-stack.js';
import { checkEnvs, checkFunction, checkKnownKeys, checkObject, checkString, fail } from '../sandbox/validate.js';
import { fsyncPath } from '../store/fsync.js';
import { sha256File } from '../store/hash.js';
import { acquireLock } from '../store/lock.js';
import {
  isReservedTemplateName,
  readTemplateRecord,
  userTemplateDir,
  writeTemplateRecord,
  type TemplateDefaults,
  type TemplateFrom,
  type TemplateRecord,
} from './record.js';
import { checkResources, DEFAULT_CPU, DEFAULT_FREE_DISK_MB, DEFAULT_MEMORY_MB, type ResourcesOpts } from './resources.js';
import { checkSteps, runSteps, type StepProgress, type TemplateStep } from './steps.js';
import { randomHex } from '../random.js';

/** One progress report of {@link Template.build}: an image's fetch ({@link ImageProgress}), then the boot, each step, the capture. */
export type TemplateBuildProgress =
  | ImageProgress
  | {
      /** Booting the sandbox the steps run in. */
      phase: 'boot';
      /** What is being done, in words. */
      message: string;
    }
  | {
      /** A step starts, or its command printed output. */
      phase: 'step';
      /** The step's index in `steps` (0-based). */
      index: number;
      /** How many steps there are. */
      total: number;
      /** The step, in words ('run npm ci', 'copy ./app -> /app'). */
      description: string;
      /** Output of a run step, as it comes. */
      output?: string;
    }
  | {
      /** Capturing the template's memory and disk. */
      phase: 'capture';
      /** What is being done, in words. */
      message: string;
    };

/** What {@link Template.build} builds: a name, what it starts from, and the steps. */
export interface TemplateBuildOpts {
  /** The template's name (what `Sandbox.create({ template })` takes); an existing one of that name is replaced. */
  name: string;
  /** What it is built on: 'base', another template's name, or a container image. */
  from: TemplateFrom;
  /** Run in order in a booted sandbox; their effects are what every sandbox from the template starts with. */
  steps?: TemplateStep[];
  /** Environment of every command of the template's sandboxes (and of the steps). */
  env?: Record<string, string>;
  /** Working directory of every command (default: the image's WorkingDir, else the user's home). */
  workdir?: string;
  /** The user commands run as (default: the image's User, else root for an image; `user` for 'base'). */
  user?: string;
  /** The machine's size (default: the parent's; 2 vCPUs, 512 MiB for 'base'). */
  resources?: ResourcesOpts;
  /** The network the steps run with (default: egress on, the host's loopback off). */
  network?: NetworkOptions;
  /** Called with each progress report (pull, boot, steps and their output, capture). */
  onProgress?: (p: TemplateBuildProgress) => void;
  /** How long the first boot of an image may take (default 60 s). */
  bootTimeoutMs?: number;
}

const SYNC_TIMEOUT_MS = 30_000;
const DEFAULT_BOOT_MS = 60_000;

function checkFrom(from: unknown): asserts from is TemplateFrom {
  if (typeof from === 'string') return checkString('opts.from', from, { nonEmpty: true });
  checkObject('opts.from', from);
  const o = (from ?? {}) as Record<string, unknown>;
  if ('image' in o) {
    checkKnownKeys('opts.from', o, ['image']);
    checkString('opts.from.image', o.image, { nonEmpty: true });
  } else if ('ociLayout' in o) {
    checkKnownKeys('opts.from', o, ['ociLayout', 'tag']);
    checkString('opts.from.ociLayout', o.ociLayout, { nonEmpty: true });
    checkString('opts.from.tag', o.tag, { nonEmpty: true });
  } else if ('dockerArchive' in o) {
    checkKnownKeys('opts.from', o, ['dockerArchive']);
    checkString('opts.from.dockerArchive', o.dockerArchive, { nonEmpty: true });
  } else fail('opts.from', "'base', a template's name, { image }, { ociLayout } or { dockerArchive }", JSON.stringify(from));
}

export function checkBuildOpts(opts: TemplateBuildOpts): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, ['name', 'from', 'steps', 'env', 'workdir', 'user', 'resources', 'network', 'onProgress', 'bootTimeoutMs']);
  checkString('opts.name', opts.name, { nonEmpty: true });
  checkTemplateName(opts.name);
  if (isReservedTemplateName(opts.name)) fail('opts.name', "a name other than 'base' and 'image-<hex>' (the automatic templates')", opts.name);
  checkFrom(opts.from);
  if (opts.from === opts.name) fail('opts.from', 'another template than the one being built', opts.from);
  checkSteps(opts.steps);
  checkEnvs('opts.env', opts.env);
  checkString('opts.workdir', opts.workdir, { nonEmpty: true });
  if (opts.workdir !== undefined && !opts.workdir.startsWith('/')) fail('opts.workdir', 'an absolute guest path', opts.workdir);
  checkString('opts.user', opts.user, { nonEmpty: true });
  checkResources('opts.resources', opts.resources);
  resolveNetwork('opts.network', opts.network);
  checkFunction('opts.onProgress', opts.onProgress);
}

/** 'KEY=value' entries as a map (the image's Env). */
function envMap(entries: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of entries) {
    const i = e.indexOf('=');
    if (i > 0) out[e.slice(0, i)] = e.slice(i + 1);
  }
  return out;
}

function absolutise(from: TemplateFrom): TemplateFrom {
  if (typeof from === 'string' || 'image' in from) return from;
  if ('ociLayout' in from) return { ...from, ociLayout: resolve(from.ociLayout) };
  return { dockerArchive: resolve(from.dockerArchive) };
}

/** What a template is built on: a restorable build and what commands in it default to. */
interface Parent {
  name: string;
  build: TemplateRecord['build'];
  defaults: TemplateDefaults;
  resources: TemplateRecord['resources'];
  image?: TemplateRecord['image'];
  /** resources.diskMb asked larger than the parent's: the build's machine grows its disk (and
   *  its ext4, online) before the steps, so the captured template has the larger disk. */
  growMb?: number;
}

/** The parent's disk, or a larger one to grow into; a smaller one is refused: ext4 does not
 *  shrink online, and the parent's files may lie anywhere on its disk. */
export function diskGrowth(asked: number | undefined, parentMb: number, parent: string): { growMb?: number } {
  if (asked === undefined || asked === parentMb) return {};
  if (asked < parentMb) {
    fail('opts.resources.diskMb', `at least ${parent}'s disk (${parentMb} MiB): a disk only grows (ext4 does not shrink online)`, asked);
  }
  return { growMb: asked };
}

function buildOf(t: TemplateBuild, inputs: TemplateInputs): TemplateRecord['build'] {
  return { dir: t.dir, kernel: inputs.kernel, rootfs: inputs.rootfs, cmdline: inputs.cmdline, diskLayers: t.diskLayers, mac: t.mac, net: inputs.net };
}

async function sizeMiBOf(path: string): Promise<number> {
  return Math.floor((await stat(path)).size / 1048576);
}

async function resolveParent(opts: TemplateBuildOpts, progress: (p: TemplateBuildProgress) => void, timings: Record<string, number>): Promise<Parent> {
  const from = opts.from;
  const r = opts.resources ?? {};
  if (typeof from === 'string' && from !== 'base') {
    const rec = await readTemplateRecord(from);
    if (!rec) throw new TemplateNotFoundError(`no template named ${JSON.stringify(from)} to build ${opts.name} from`);
    for (const [k, v] of [['cpu', r.cpu], ['memoryMb', r.memoryMb]] as const) {
      if (v !== undefined && v !== rec.resources[k]) {
        fail(`opts.resources.${k}`, `the parent template's (${rec.resources[k]}): a template built from another continues its machine`, v);
      }
    }
    const growth = diskGrowth(r.diskMb, rec.resources.diskMb, `template ${rec.name}`);
    return { name: rec.name, build: rec.build, defaults: rec.defaults, resources: rec.resources, ...(rec.image ? { image: rec.image } : {}), ...growth };
  }
  const artifacts = await sharedArtifacts(undefined);
  if (!artifacts.linuxBootable) throw new KvmUnavailableError(`cannot build a template on this host: ${artifacts.notes.join(' ')}`);
  const { cmdline: netCmdline } = SandboxNetwork.machineOptions('sbx_0000000000000000');
  const cpu = r.cpu ?? DEFAULT_CPU;
  const memoryMb = r.memoryMb ?? DEFAULT_MEMORY_MB;
  const cmdline = [GUEST_CMDLINE, netCmdline].join(' ');
  const bootMs = opts.bootTimeoutMs ?? DEFAULT_BOOT_MS;
  if (from === 'base') {
    const diskMb = await sizeMiBOf(artifacts.rootfs);
    const growth = diskGrowth(r.diskMb, diskMb, 'the base image');
    const inputs: TemplateInputs = { name: 'base', kernel: artifacts.kernel, rootfs: artifacts.rootfs, cmdline, vcpus: cpu, memoryMiB: memoryMb, net: true };
    progress({ phase: 'boot', message: 'the base template' });
    const t0 = Date.now();
    const { template } = await ensureTemplate(inputs, { bootTimeoutMs: bootMs });
    timings.boot = Date.now() - t0;
    return { name: 'base', build: buildOf(template, inputs), defaults: { envs: {}, user: '', cwd: '' }, resources: { cpu, memoryMb, diskMb }, ...growth };
  }
  let t0 = Date.now();
  const image: PulledImage = await fetchImage(from, { onProgress: progress });
  timings.pull = Date.now() - t0;
  t0 = Date.now();
  const agent = { path: artifacts.agent, sha256: await sha256File(artifacts.agent) };
  const rootfs = await imageRootfs(image, { agent, onProgress: progress, ...(r.diskMb !== undefined ? { sizeMiB: r.diskMb } : {}) });
  timings.unpack = Date.now() - t0;
  const name = `image-${createHash('sha256').update(rootfs.path).digest('hex').slice(0, 16)}`;
  const inputs: TemplateInputs = { name, kernel: artifacts.kernel, rootfs: rootfs.path, cmdline, vcpus: cpu, memoryMiB: memoryMb, net: true };
  progress({ phase: 'boot', message: `${image.source} (${image.configDigest.slice(0, 19)})` });
  t0 = Date.now();
  const { template } = await ensureTemplate(inputs, { bootTimeoutMs: bootMs });
  timings.boot = Date.now() - t0;
  const c = image.config;
  return {
    name,
    build: buildOf(template, inputs),
    defaults: { envs: envMap(c.env), user: c.user || '0', cwd: c.workingDir },
    resources: { cpu, memoryMb, diskMb: rootfs.sizeMiB },
    image: { source: image.source, manifestDigest: image.manifestDigest, configDigest: image.configDigest, entrypoint: c.entrypoint, cmd: c.cmd, config: c },
  };
}

function describeStep(s: TemplateStep): string {
  if ('run' in s) return `run ${Array.isArray(s.run) ? s.run.join(' ') : s.run}`;
  if ('copy' in s) return `copy ${s.copy.from} -> ${s.copy.to}`;
  if ('env' in s) return `env ${Object.keys(s.env).join(' ')}`;
  return `workdir ${s.workdir}`;
}

/** Restores `parent` into a new build directory, runs the steps, captures; returns the build. */
async function captureSteps(
  opts: TemplateBuildOpts,
  parent: Parent,
  network: ResolvedNetwork,
  progress: (p: TemplateBuildProgress) => void,
  timings: Record<string, number>,
): Promise<{ build: TemplateRecord['build']; defaults: TemplateDefaults }> {
  const builds = join(userTemplateDir(opts.name), 'builds');
  await mkdir(builds, { recursive: true });
  const buildName = `b-${Date.now()}-${randomHex(4)}`;
  const tmp = join(builds, `.tmp-${buildName}-${process.pid}`);
  await mkdir(tmp, { recursive: true });
  const undo = new UndoStack();
  undo.defer(() => rm(tmp, { recursive: true, force: true }));
  try {
    let t0 = Date.now();
    const growBytes = parent.growMb !== undefined ? parent.growMb * 1048576 : undefined;
    const restore = { into: tmp, state: 'paused' as const, ...(growBytes !== undefined ? { diskBytes: [growBytes] } : {}) };
    const guest = await GuestRun.restore(parent.build.dir, restore, { network: parent.build.net ? network : false, agentTimeoutMs: opts.bootTimeoutMs ?? DEFAULT_BOOT_MS });
    undo.defer(() => guest.stop());
    const client = guest.client;
    // Before the steps, so they (and the template's sandboxes) see the larger filesystem.
    if (growBytes !== undefined) await growRootFs(client, growBytes);
    timings.restore = Date.now() - t0;
    t0 = Date.now();
    const defaults = await runSteps(
      (d) => createAgentApi(client, d),
      opts.steps ?? [],
      { envs: { ...parent.defaults.envs, ...(opts.env ?? {}) }, user: opts.user ?? parent.defaults.user, cwd: opts.workdir ?? parent.defaults.cwd },
      (p: StepProgress) => progress({ phase: 'step', index: p.index, total: p.total, description: describeStep(p.step), ...(p.output !== undefined ? { output: p.output } : {}) }),
    );
    timings.steps = Date.now() - t0;
    t0 = Date.now();
    progress({ phase: 'capture', message: 'sync, then memory and disk' });
    await syncGuest(client, SYNC_TIMEOUT_MS);
    const snap = await guest.capture(tmp);
    // The running top (hard-linked into the generation) is nobody's once the machine stopped.
    await rm(join(tmp, 'tops'), { recursive: true, force: true });
    const final = join(builds, buildName);
    const layers = (snap.diskLayers[0] ?? []).map((p) => (p.startsWith('/') ? p : join(final, p)));
    await freeze(tmp);
    await fsyncPath(tmp);
    await rename(tmp, final);
    await fsyncPath(builds);
    timings.capture = Date.now() - t0;
    undo.move();
    return { build: { ...parent.build, dir: final, diskLayers: layers }, defaults };
  } catch (err) {
    await undo.disposeAsync().catch(() => undefined);
    throw err;
  }
}

/** Builds (or rebuilds) template `opts.name`; one builder per name across processes. */
export async function buildTemplate(opts: TemplateBuildOpts): Promise<TemplateRecord> {
  checkBuildOpts(opts);
  const support = await linuxGuestSupport();
  if (!support.ok) throw new KvmUnavailableError(`cannot build a template on this host: ${support.reason}`);
  const progress = (p: TemplateBuildProgress) => {
    try {
      opts.onProgress?.(p);
    } catch {
      /* a progress callback's failure is the caller's, not the build's */
    }
  };
  const network = resolveNetwork('opts.network', opts.network) || { egress: true, allowHostLoopback: false, ports: [] };
  const dir = userTemplateDir(opts.name);
  await mkdir(dir, { recursive: true });
  const lock = await acquireLock(join(dir, 'build.lock'));
  const started = Date.now();
  const timings: Record<string, number> = {};
  try {
    const parent = await resolveParent(opts, progress, timings);
    const ownDefaults = opts.env !== undefined || opts.user !== undefined || opts.workdir !== undefined;
    let build = parent.build;
    let defaults = parent.defaults;
    const steps = opts.steps ?? [];
    if (steps.length > 0 || parent.growMb !== undefined) {
      ({ build, defaults } = await captureSteps(opts, parent, network, progress, timings));
    } else if (ownDefaults) {
      defaults = { envs: { ...parent.defaults.envs, ...(opts.env ?? {}) }, user: opts.user ?? parent.defaults.user, cwd: opts.workdir ?? parent.defaults.cwd };
    }
    timings.total = Date.now() - started;
    const record: TemplateRecord = {
      version: 1,
      name: opts.name,
      from: absolutise(opts.from),
      parent: parent.name,
      createdAt: new Date().toISOString(),
      resources: { ...parent.resources, ...(parent.growMb !== undefined ? { diskMb: parent.growMb } : {}) },
      defaults,
      ...(parent.image ? { image: parent.image } : {}),
      steps: steps.length,
      build,
      timings,
    };
    await writeTemplateRecord(record);
    return record;
  } finally {
    await lock.release();
  }
}

