// ensureArtifacts(): everything a Linux sandbox boots from (kernel, root
// filesystem, agent), built once into the store and reused. `torpor setup`
// and Sandbox.create both come through here.
import { mkdir, open, readFile, rename } from 'node:fs/promises';

import { TorporError } from '../errors.js';
import { checkArtifact, artifactDir, artifactKey, storeError } from '../store/artifact.js';
import { homeLayout, torporHome } from '../store/home.js';
import { ensureAgent } from './agent.js';
import { detectHost, type HostKind } from './host.js';
import { builtKernel, builtKernelSpec, suppliedKernel, type KernelArtifact } from './kernel.js';
import { inspectKernel, type KernelFormat } from './kernel-format.js';
import type { PhaseName, ProgressSink } from './progress.js';
import { baseIsCached, ensureRootfs } from './rootfs.js';
import { toolsError } from './tools.js';

export interface EnsureArtifactsOptions {
  /** Torpor home (default torporHome()). */
  home?: string;
  /** A kernel to use instead of ours; validated and copied into the store. Default: $TORPOR_KERNEL, then the one `torpor setup --kernel` recorded. */
  kernel?: string;
  /** Remember `kernel` for later runs (what `torpor setup --kernel` does). */
  recordKernel?: boolean;
  /** Forget a remembered kernel and go back to ours (`torpor setup --own-kernel`). */
  forgetKernel?: boolean;
  /** A prebuilt static agent instead of `make -C guest/agent` (default: $TORPOR_AGENT). */
  agent?: string;
  /** Hash every artifact in full instead of the cheap size/mtime/header check. */
  verify?: boolean;
  onProgress?: ProgressSink;
}

export interface Artifacts {
  kernel: string;
  rootfs: string;
  agent: string;
  host: HostKind;
}

export interface SetupReport extends Artifacts {
  kernelFormat: KernelFormat;
  kernelOrigin: 'built' | 'supplied';
  /** False on a PVM host without a supplied kernel: our kernel cannot run Linux guests there. */
  linuxBootable: boolean;
  /** Phases that built something in this call. */
  built: PhaseName[];
  /** Things the user must know (what is missing to run Linux guests here). */
  notes: string[];
}

/** What `torpor setup --kernel` remembers under TORPOR_HOME/setup.json. */
interface SetupRecord {
  kernel?: { source: string; sha256: string; format: KernelFormat };
}

/** setup.json as written by writeRecord; anything else in it (hand-edited, truncated) is ignored, not trusted. */
async function readRecord(path: string): Promise<SetupRecord> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(await readFile(path, 'utf8'));
  } catch {
    return {};
  }
  const kernel = (parsed as SetupRecord | null)?.kernel;
  if (
    typeof kernel === 'object' &&
    kernel !== null &&
    typeof kernel.source === 'string' &&
    kernel.source !== '' &&
    typeof kernel.sha256 === 'string' &&
    /^[0-9a-f]{64}$/.test(kernel.sha256) &&
    (kernel.format === 'elf-pvh' || kernel.format === 'elf-64' || kernel.format === 'bzimage')
  ) {
    return { kernel: { source: kernel.source, sha256: kernel.sha256, format: kernel.format } };
  }
  return {};
}

/** Replaces setup.json atomically and durably: a crash leaves the old record or the new one. */
async function writeRecord(path: string, record: SetupRecord): Promise<void> {
  const tmp = `${path}.${process.pid}.tmp`;
  const fh = await open(tmp, 'w');
  try {
    await fh.writeFile(JSON.stringify(record, null, 2) + '\n');
    await fh.sync();
  } finally {
    await fh.close();
  }
  await rename(tmp, path);
}

export const PVM_KERNEL_NOTE =
  'This host is a PVM host (kvm_pvm: KVM without hardware virtualization). Linux guests here need a ' +
  "guest kernel built for this host's PVM; torpor's own kernel (built and stored) runs on hardware-" +
  'virtualization hosts only. To run Linux sandboxes here, supply one: TORPOR_KERNEL=/path/to/vmlinux ' +
  'or `torpor setup --kernel /path/to/vmlinux`. The test guest (guest/testvm) runs here regardless.';

function isRoot(): boolean {
  return typeof process.getuid === 'function' && process.getuid() === 0;
}

async function isCached(root: string, kind: string, inputs: Record<string, string | Uint8Array>, files: string[], verify: boolean): Promise<boolean> {
  const key = artifactKey(kind, inputs);
  return (await checkArtifact(artifactDir(root, kind, key), key, files, verify)).ok;
}

/** What ensureArtifacts decided before building anything: what is stored, what must be built. */
interface SetupPlan {
  layout: ReturnType<typeof homeLayout>;
  root: string;
  verify: boolean;
  record: SetupRecord;
  explicitKernel: string | undefined;
  supplied: string | undefined;
  prebuiltAgent: string | undefined;
  kernelSpec: Awaited<ReturnType<typeof builtKernelSpec>> | undefined;
  /** Phases whose artifacts are missing (the agent is always checked: it is cheap). */
  needed: PhaseName[];
  baseCached: boolean;
}

/** Reads the store; builds and writes nothing (a --own-kernel is applied to the plan only). */
async function planSetup(options: EnsureArtifactsOptions, progress?: ProgressSink): Promise<SetupPlan> {
  const layout = homeLayout(options.home ?? torporHome());
  const root = layout.artifacts;
  const verify = options.verify ?? false;
  const record = await readRecord(layout.setupRecord);
  const explicitKernel = options.kernel ?? process.env.TORPOR_KERNEL;
  const supplied = explicitKernel ?? (options.forgetKernel ? undefined : record.kernel?.source);
  const prebuiltAgent = options.agent ?? process.env.TORPOR_AGENT;
  const needed: PhaseName[] = [];
  const kernelSpec = supplied ? undefined : await builtKernelSpec(progress);
  if (kernelSpec && !(await isCached(root, kernelSpec.kind, kernelSpec.inputs, kernelSpec.files, verify))) {
    needed.push('kernel');
  }
  const baseCached = await baseIsCached(root, verify);
  if (!baseCached) needed.push('rootfs');
  return { layout, root, verify, record, explicitKernel, supplied, prebuiltAgent, kernelSpec, needed, baseCached };
}

/**
 * Everything that stops setup on this host before it builds, in a stable order:
 * missing tools (MISSING_TOOLS, every package named), then missing root
 * (PERMISSION_DENIED, with the command that works). Empty when nothing does.
 */
function blockersOf(plan: SetupPlan): TorporError[] {
  const blockers: TorporError[] = [];
  const missing = toolsError(plan.prebuiltAgent ? plan.needed : ['agent', ...plan.needed]);
  if (missing) blockers.push(missing);
  if (!plan.baseCached && !isRoot()) {
    blockers.push(
      new TorporError(
        'PERMISSION_DENIED',
        'building the root filesystem needs root (mmdebstrap creates files owned by root; mkfs.ext4 -d copies ' +
          `ownership as found). Build it once as root into this TORPOR_HOME, then take it back: ` +
          `sudo env TORPOR_HOME=${plan.layout.root} npx torpor setup && sudo chown -R "$(id -u):$(id -g)" ${plan.layout.root} ` +
          "(plain `sudo npx torpor setup` would build into root's own home instead). Later runs as you reuse the image.",
      ),
    );
  }
  return blockers;
}

/** One error for all blockers: the first one's code, each one's code and message in order. */
function oneError(blockers: TorporError[]): TorporError {
  if (blockers.length === 1) return blockers[0]!;
  return new TorporError(
    blockers[0]!.code,
    `setup cannot start on this host, for ${blockers.length} reasons: ` +
      blockers.map((b, i) => `(${i + 1}) ${b.code}: ${b.message}`).join(' '),
  );
}

/**
 * Why ensureArtifacts(options) would refuse to start here (missing tools, missing root: the
 * same one message), or null when it would run. Reads the store; builds and writes nothing.
 */
export async function setupBlocker(options: EnsureArtifactsOptions = {}): Promise<TorporError | null> {
  const blockers = blockersOf(await planSetup(options));
  return blockers.length ? oneError(blockers) : null;
}

export async function ensureArtifacts(options: EnsureArtifactsOptions = {}): Promise<SetupReport> {
  const progress = options.onProgress;
  const layout = homeLayout(options.home ?? torporHome());
  await mkdir(layout.artifacts, { recursive: true }).catch((err: unknown) => {
    throw storeError(err, layout.artifacts);
  });

  const host = detectHost();
  // A bad kernel is refused before anything else starts building.
  const explicit = options.kernel ?? process.env.TORPOR_KERNEL;
  if (explicit) await inspectKernel(explicit);

  // Decide up front which phases must build, so a host missing tools or root hears
  // about all of it in one message, before a five-minute kernel build. (Adding a
  // changed agent to the image needs only debugfs, checked with the agent phase.)
  const plan = await planSetup(options, progress);
  const { root, verify, record, explicitKernel, supplied, prebuiltAgent, kernelSpec } = plan;
  const blockers = blockersOf(plan);
  if (blockers.length) throw oneError(blockers);
  if (options.forgetKernel && record.kernel) {
    delete record.kernel;
    await writeRecord(layout.setupRecord, record);
  }

  const built: PhaseName[] = [];
  const agentStart = Date.now();
  const agent = await ensureAgent(root, verify, prebuiltAgent, progress);
  progress?.({ phase: 'agent', status: agent.artifact.built ? 'done' : 'cached', message: agent.path, elapsedMs: Date.now() - agentStart });
  if (agent.artifact.built) built.push('agent');

  // The kernel build is CPU-bound, the image build mostly I/O and downloads: overlap them.
  const kernelPromise = (async (): Promise<KernelArtifact> => {
    const t0 = Date.now();
    let kernel: KernelArtifact;
    if (supplied) {
      const known = !explicitKernel && record.kernel ? record.kernel : undefined;
      kernel = await suppliedKernel(supplied, root, verify, known);
      if (options.recordKernel && options.kernel) {
        await writeRecord(layout.setupRecord, {
          ...record,
          kernel: { source: options.kernel, sha256: kernel.sha256, format: kernel.info.format },
        });
      }
    } else {
      kernel = await builtKernel(root, verify, progress, kernelSpec);
    }
    progress?.({
      phase: 'kernel',
      status: kernel.artifact.built ? 'done' : 'cached',
      message: `${kernel.path} (${kernel.origin}, ${kernel.info.format})`,
      elapsedMs: Date.now() - t0,
    });
    if (kernel.artifact.built) built.push('kernel');
    return kernel;
  })();
  const rootfsPromise = (async () => {
    const t0 = Date.now();
    const rootfs = await ensureRootfs(root, agent, verify, progress);
    progress?.({ phase: 'rootfs', status: rootfs.artifact.built ? 'done' : 'cached', message: rootfs.path, elapsedMs: Date.now() - t0 });
    if (rootfs.artifact.built) built.push('rootfs');
    return rootfs;
  })();
  const [kernelResult, rootfsResult] = await Promise.allSettled([kernelPromise, rootfsPromise]);
  if (kernelResult.status === 'rejected') throw kernelResult.reason;
  if (rootfsResult.status === 'rejected') throw rootfsResult.reason;
  const kernel = kernelResult.value;
  const rootfs = rootfsResult.value;

  const notes: string[] = [];
  const linuxBootable = !(host.kind === 'pvm' && kernel.origin === 'built');
  if (!linuxBootable) notes.push(PVM_KERNEL_NOTE);
  if (!host.kvm) notes.push('/dev/kvm does not exist on this host: artifacts are built, but no machine can start here.');

  return {
    kernel: kernel.path,
    rootfs: rootfs.path,
    agent: agent.path,
    host: host.kind,
    kernelFormat: kernel.info.format,
    kernelOrigin: kernel.origin,
    linuxBootable,
    built,
    notes,
  };
}
