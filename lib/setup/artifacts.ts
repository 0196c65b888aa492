// ensureArtifacts(): everything a Linux sandbox boots from (kernel, root
// filesystem, agent), built once into the store and reused. `torpor setup`
// and Sandbox.create both come through here.
import { mkdir, open, readFile, rename } from 'node:fs/promises';

import { TorporError } from '../errors.js';
import { checkArtifact, artifactDir, artifactKey, storeError } from '../store/artifact.js';
import { homeLayout, torporHome } from '../store/home.js';
import { ensureAgent, type PrebuiltAgent } from './agent.js';
import { BASE_RECORD, baseImageRef, baseRelease, ensureImageBase, imageBaseIsCached } from './base-image.js';
import { detectHost, type HostKind } from './host.js';
import { builtKernel, builtKernelSpec, suppliedKernel, type KernelArtifact } from './kernel.js';
import { inspectKernel, type KernelFormat } from './kernel-format.js';
import { kernelPackage, packagedAgent, packagedKernel, type KernelPackage } from './kernel-package.js';
import type { PhaseName, ProgressSink } from './progress.js';
import { baseIsCached, ensureRootfs, ensureRootfsUnshare, userBaseIsCached } from './rootfs.js';
import { unshareBlocker } from './unshare.js';
import { toolsError, type ToolSet } from './tools.js';

/** How {@link ensureArtifacts} finds or builds the guest's kernel, root filesystem and agent. Every field is optional. */
export interface EnsureArtifactsOptions {
  /** Torpor home (default torporHome()). */
  home?: string;
  /** A kernel to use instead of ours; validated and copied into the store. Default: $TORPOR_KERNEL, then the one `torpor setup --kernel` recorded. */
  kernel?: string;
  /** Remember `kernel` for later runs (what `torpor setup --kernel` does). */
  recordKernel?: boolean;
  /** Forget a remembered kernel and go back to ours (`torpor setup --own-kernel`). */
  forgetKernel?: boolean;
  /** A prebuilt static agent instead of `make -C guest/agent` (default: $TORPOR_AGENT, then the kernel package's). */
  agent?: string;
  /**
   * The base root filesystem from this container image (pulled, no root needed) instead of
   * Debian packages through mmdebstrap (root). Default: $TORPOR_BASE_IMAGE. Pin it by digest.
   */
  baseImage?: string;
  /** Remember the base image for later runs (what `torpor setup` does when one is given). */
  recordBaseImage?: boolean;
  /** Forget a remembered base image and go back to the Debian build (`torpor setup --debian-base`). */
  forgetBaseImage?: boolean;
  /** Hash every artifact in full instead of the cheap size/mtime/header check. */
  verify?: boolean;
  /** Called with each phase's progress (what `torpor setup` prints). */
  onProgress?: ProgressSink;
}

/** The files a Linux sandbox boots from, in the store. */
export interface Artifacts {
  /** The guest kernel's path. */
  kernel: string;
  /** The base root filesystem image's path (ext4). */
  rootfs: string;
  /** The guest agent binary's path (static; also inside the root filesystem). */
  agent: string;
  /** This host's kind of KVM. */
  host: HostKind;
}

/** What {@link ensureArtifacts} found, built or fetched, and where each part comes from. */
export interface SetupReport extends Artifacts {
  /** How the kernel boots: a PVH ELF, a 64-bit ELF or a bzImage. */
  kernelFormat: KernelFormat;
  /** Where the kernel came from: built from source, the kernel package (@torpor/kernel-linux-x64), or the user's. */
  kernelOrigin: 'built' | 'package' | 'supplied';
  /** Where the base root filesystem came from: the image reference, or 'debian' (mmdebstrap). */
  baseSource: string;
  /** False on a PVM host without a supplied kernel: our kernel cannot run Linux guests there. */
  linuxBootable: boolean;
  /** Phases that built something from source in this call (compiled, or mmdebstrap). */
  built: PhaseName[];
  /** Parts fetched or made from prebuilt inputs in this call: the kernel package's kernel and agent, the base image. */
  fetched: string[];
  /** Where each part comes from, and why (what `torpor doctor` prints). */
  sources: {
    /** The kernel's source, in words. */
    kernel: string;
    /** The agent's source, in words. */
    agent: string;
    /** The base root filesystem's source, in words. */
    base: string;
  };
  /** Things the user must know (what is missing to run Linux guests here). */
  notes: string[];
}

/** What `torpor setup --kernel` remembers under TORPOR_HOME/setup.json. */
interface SetupRecord {
  kernel?: { source: string; sha256: string; format: KernelFormat };
  /** The base image setup made the root filesystem from (TORPOR_BASE_IMAGE when setup ran), so that
   *  later runs (Sandbox.create without the variable) keep using it. */
  baseImage?: string;
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
    return { kernel: { source: kernel.source, sha256: kernel.sha256, format: kernel.format }, ...baseImageOf(parsed) };
  }
  return baseImageOf(parsed);
}

function baseImageOf(parsed: unknown): Pick<SetupRecord, 'baseImage'> {
  const ref = (parsed as SetupRecord | null)?.baseImage;
  if (typeof ref !== 'string' || ref === '') return {};
  try {
    return { baseImage: baseImageRef(ref) };
  } catch {
    return {};
  }
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
  prebuiltAgent: string | PrebuiltAgent | undefined;
  /** The prebuilt kernel and agent (an installed, recorded kernel package), when they apply. */
  kernelPkg: KernelPackage | undefined;
  kernelSpec: Awaited<ReturnType<typeof builtKernelSpec>> | undefined;
  /** The base image to pull, or undefined for the Debian build. */
  baseImage: string | undefined;
  /** The base image was asked for now (option or TORPOR_BASE_IMAGE), not recorded or a default. */
  baseAsked: boolean;
  /** Phases that must build from source (the agent is always checked: it is cheap). */
  needed: PhaseName[];
  /** What must be fetched or made without a build: the kernel package's copy, the base image. */
  fetch: string[];
  baseCached: boolean;
  /** The Debian base is built without root (mmdebstrap's unshare mode). */
  unshare: boolean;
  /** For doctor and setup: where each part comes from, and why. */
  sources: { kernel: string; agent: string; base: string };
}

/** Reads the store; builds and writes nothing (a --own-kernel is applied to the plan only). */
async function planSetup(options: EnsureArtifactsOptions, progress?: ProgressSink): Promise<SetupPlan> {
  const layout = homeLayout(options.home ?? torporHome());
  const root = layout.artifacts;
  const verify = options.verify ?? false;
  const record = await readRecord(layout.setupRecord);
  const explicitKernel = options.kernel ?? process.env.TORPOR_KERNEL;
  const supplied = explicitKernel ?? (options.forgetKernel ? undefined : record.kernel?.source);
  const needed: PhaseName[] = [];
  const fetch: string[] = [];
  // The kernel package: unless a kernel is supplied or TORPOR_KERNEL_PACKAGE=0 asks to build.
  const pkg = supplied || process.env.TORPOR_KERNEL_PACKAGE === '0' ? undefined : kernelPackage();
  const kernelPkg = pkg && 'found' in pkg ? pkg.found : undefined;
  const userAgent = options.agent ?? process.env.TORPOR_AGENT;
  const prebuiltAgent: string | PrebuiltAgent | undefined = userAgent ?? (kernelPkg ? packagedAgent(kernelPkg) : undefined);
  let kernelSource: string;
  let kernelSpec: SetupPlan['kernelSpec'];
  if (supplied) {
    kernelSource = `supplied: ${supplied}${explicitKernel ? '' : ' (recorded by torpor setup --kernel)'}`;
  } else if (kernelPkg) {
    const { release } = kernelPkg;
    const stored = await isCached(root, 'kernel-package', { sha256: release.kernel.sha256 }, ['vmlinux'], verify);
    if (!stored) fetch.push(`the kernel from ${release.package}@${release.version} (copied into the store after its sha256 is checked)`);
    kernelSource = `prebuilt: ${release.package}@${release.version}, Linux ${release.kernel.linux} (${kernelPkg.dir}; sha256 ${release.kernel.sha256.slice(0, 12)}, as released)`;
  } else {
    kernelSpec = await builtKernelSpec(progress);
    if (!(await isCached(root, kernelSpec.kind, kernelSpec.inputs, kernelSpec.files, verify))) needed.push('kernel');
    const why = pkg && 'missing' in pkg ? pkg.missing : 'TORPOR_KERNEL_PACKAGE=0';
    kernelSource = `built from source (guest/kernel: Linux 6.1 and torpor.config; several minutes, needs a compiler): ${why}`;
  }
  const agentSource = userAgent
    ? `supplied: ${userAgent}`
    : kernelPkg
      ? `prebuilt: ${kernelPkg.release.package}@${kernelPkg.release.version} (sha256 ${kernelPkg.release.agent.sha256.slice(0, 12)}, as released)`
      : 'built from source (make -C guest/agent: musl-gcc)';
  // The base: asked for now, else what an earlier setup recorded, else the image this release
  // names (base-image.json), else the Debian build. --debian-base skips the last two.
  const asked = baseImageRef(options.baseImage);
  const released = options.forgetBaseImage ? undefined : baseRelease();
  const baseImage = asked ?? (options.forgetBaseImage ? undefined : record.baseImage) ?? released?.reference;
  let baseCached: boolean;
  let baseSource: string;
  /** Debian base without root: null when unshare mode will build it, a reason when it cannot, undefined when not asked. */
  let unshareWhy: string | null | undefined;
  // A base made without root (an image's, unshare mode's) is keyed by the agent's hash too: known
  // without building only for a prebuilt agent; a built one is checked when the agent phase has
  // run (setup reports it).
  const agentSha = typeof prebuiltAgent === 'object' ? prebuiltAgent.expect?.sha256 : undefined;
  if (baseImage) {
    baseCached = agentSha !== undefined && (await imageBaseIsCached(root, baseImage, agentSha, verify));
    const size = baseImage === released?.reference ? `, ${(released.layer.size / 2 ** 20).toFixed(0)} MiB to download` : '';
    if (!baseCached) fetch.push(`the base image ${baseImage} (pulled${size}, then written as ext4 with mke2fs -d; no root)`);
    const from = asked
      ? options.baseImage
        ? 'asked for'
        : 'TORPOR_BASE_IMAGE'
      : record.baseImage === baseImage
        ? 'recorded by torpor setup'
        : `torpor's default, named by its ${BASE_RECORD}`;
    baseSource = `container image ${baseImage} (${from}): pulled and made into ext4 without root`;
  } else {
    baseCached = await baseIsCached(root, verify);
    // Without root, and with no root-built base stored, mmdebstrap's unshare mode where this
    // host allows it.
    unshareWhy = baseCached || isRoot() ? undefined : (unshareBlocker() ?? null);
    if (unshareWhy === null) baseCached = agentSha !== undefined && (await userBaseIsCached(root, agentSha, verify));
    if (!baseCached) needed.push('rootfs');
    const why = options.forgetBaseImage
      ? 'asked for (--debian-base)'
      : `no TORPOR_BASE_IMAGE is set and this torpor names no default image (no ${BASE_RECORD}: a checkout, not a release)`;
    baseSource =
      unshareWhy === null
        ? `Debian bookworm from this host's apt sources (mmdebstrap's unshare mode: no root, user namespaces; guest/image/build.sh --tar), made into ext4 without root: ${why}`
        : "Debian bookworm from this host's apt sources (mmdebstrap, as root: guest/image/build.sh): " +
          why +
          (unshareWhy ? `; not without root here: ${unshareWhy}` : '') +
          '; set TORPOR_BASE_IMAGE (pinned by digest) to make it without root';
  }
  return {
    layout,
    root,
    verify,
    record,
    explicitKernel,
    supplied,
    prebuiltAgent,
    kernelPkg,
    kernelSpec,
    baseImage,
    baseAsked: asked !== undefined,
    needed,
    fetch,
    baseCached,
    unshare: unshareWhy === null,
    sources: { kernel: kernelSource, agent: agentSource, base: baseSource },
  };
}

/** The host tools this plan uses: a build's for each phase built from source, the image pipeline's for a base image. */
function toolSetsOf(plan: SetupPlan): ToolSet[] {
  const needed = plan.needed.map((p): ToolSet => (p === 'rootfs' && plan.unshare ? 'rootfs-user' : p));
  return [...(plan.prebuiltAgent ? [] : (['agent'] as const)), ...needed, ...(plan.baseImage ? (['image'] as const) : [])];
}

/**
 * Everything that stops setup on this host before it builds, in a stable order:
 * missing tools (MISSING_TOOLS, every package named), then missing root
 * (PERMISSION_DENIED, with the command that works). Empty when nothing does.
 */
function blockersOf(plan: SetupPlan): TorporError[] {
  const blockers: TorporError[] = [];
  const missing = toolsError(toolSetsOf(plan));
  if (missing) blockers.push(missing);
  if (!plan.baseImage && !plan.baseCached && !plan.unshare && !isRoot()) {
    blockers.push(
      new TorporError(
        'PERMISSION_DENIED',
        'building the root filesystem needs root (mmdebstrap creates files owned by root; mkfs.ext4 -d copies ' +
          `ownership as found). Build it once as root into this TORPOR_HOME, then take it back: ` +
          `sudo env TORPOR_HOME=${plan.layout.root} npx torpor setup && sudo chown -R "$(id -u):$(id -g)" ${plan.layout.root} ` +
          "(plain `sudo npx torpor setup` would build into root's own home instead). Later runs as you reuse the image. " +
          'Or, without root: TORPOR_BASE_IMAGE=<an image reference, pinned by digest> makes the base from a container image.',
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

/** What the first run (or the next setup) will do here, before it does it: `torpor doctor`. */
export interface SetupOutlook {
  sources: { kernel: string; agent: string; base: string };
  /** Parts to fetch or make from prebuilt inputs. */
  fetch: string[];
  /** Phases to build from source. */
  build: PhaseName[];
  /** Why setup would not start here, or null. */
  /** The host tool sets setup will use (tools.ts): what `--install-deps` installs packages for. */
  tools: ToolSet[];
  blocker: TorporError | null;
}

export async function setupOutlook(options: EnsureArtifactsOptions = {}): Promise<SetupOutlook> {
  const plan = await planSetup(options);
  const blockers = blockersOf(plan);
  return { sources: plan.sources, fetch: plan.fetch, build: plan.needed, tools: toolSetsOf(plan), blocker: blockers.length ? oneError(blockers) : null };
}

/**
 * Everything a Linux sandbox boots from (kernel, root filesystem, agent), built or fetched once
 * into the store under TORPOR_HOME and reused: what `torpor setup` runs, and what
 * Sandbox.create asks on first use. Cheap when all is there (a size/mtime/header check).
 *
 * @param options - A kernel, agent or base image to use instead of torpor's; progress; home.
 * @returns What there is now and where each part came from.
 * @throws {@link TorporError} MISSING_TOOLS (the packages to install named), PERMISSION_DENIED
 *   (building the root filesystem needs root: the command that works named), KERNEL_INVALID,
 *   KERNEL_PACKAGE_MISMATCH, ARTIFACT_CORRUPT, SETUP_FAILED.
 */
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
  const { root, verify, record, explicitKernel, supplied, prebuiltAgent, kernelSpec, kernelPkg, baseImage } = plan;
  const blockers = blockersOf(plan);
  if (blockers.length) throw oneError(blockers);
  if ((options.forgetKernel && record.kernel) || (options.forgetBaseImage && record.baseImage)) {
    if (options.forgetKernel) delete record.kernel;
    if (options.forgetBaseImage) delete record.baseImage;
    await writeRecord(layout.setupRecord, record);
  }

  const built: PhaseName[] = [];
  const fetched: string[] = [];
  const agentStart = Date.now();
  const agent = await ensureAgent(root, verify, prebuiltAgent, progress);
  progress?.({ phase: 'agent', status: agent.artifact.built ? 'done' : 'cached', message: agent.path, elapsedMs: Date.now() - agentStart });
  if (agent.artifact.built) {
    if (prebuiltAgent) fetched.push(kernelPkg && !options.agent && !process.env.TORPOR_AGENT ? `agent (${kernelPkg.release.package})` : 'agent (supplied)');
    else built.push('agent');
  }

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
    } else if (kernelPkg) {
      kernel = await packagedKernel(kernelPkg, root, verify);
    } else {
      kernel = await builtKernel(root, verify, progress, kernelSpec);
    }
    progress?.({
      phase: 'kernel',
      status: kernel.artifact.built ? 'done' : 'cached',
      message: `${kernel.path} (${kernel.origin}, ${kernel.info.format})`,
      elapsedMs: Date.now() - t0,
    });
    if (kernel.artifact.built) {
      if (kernel.origin === 'built') built.push('kernel');
      else fetched.push(kernel.origin === 'package' ? `kernel (${kernelPkg!.release.package})` : 'kernel (supplied)');
    }
    return kernel;
  })();
  const rootfsPromise = (async () => {
    const t0 = Date.now();
    const rootfs = baseImage
      ? await ensureImageBase(layout.root, root, baseImage, agent, verify, progress)
      : plan.unshare
        ? await ensureRootfsUnshare(layout.root, root, agent, verify, progress)
        : await ensureRootfs(root, agent, verify, progress);
    progress?.({ phase: 'rootfs', status: rootfs.artifact.built ? 'done' : 'cached', message: rootfs.path, elapsedMs: Date.now() - t0 });
    if (rootfs.artifact.built) {
      if (baseImage) fetched.push(`base image (${baseImage})`);
      else built.push('rootfs');
    }
    return rootfs;
  })();
  const [kernelResult, rootfsResult] = await Promise.allSettled([kernelPromise, rootfsPromise]);
  if (kernelResult.status === 'rejected') throw kernelResult.reason;
  if (rootfsResult.status === 'rejected') throw rootfsResult.reason;
  const kernel = kernelResult.value;
  const rootfs = rootfsResult.value;
  // Only a choice is recorded: torpor's default is read from its release each time, so an
  // upgrade that names a new default takes it.
  if (baseImage && plan.baseAsked && options.recordBaseImage && record.baseImage !== baseImage) {
    // Read again: the kernel phase may have recorded a --kernel meanwhile.
    await writeRecord(layout.setupRecord, { ...(await readRecord(layout.setupRecord)), baseImage });
  }

  const notes: string[] = [];
  const linuxBootable = !(host.kind === 'pvm' && kernel.origin !== 'supplied');
  if (!linuxBootable) notes.push(PVM_KERNEL_NOTE);
  if (!host.kvm) notes.push('/dev/kvm does not exist on this host: artifacts are built, but no machine can start here.');

  return {
    kernel: kernel.path,
    rootfs: rootfs.path,
    agent: agent.path,
    host: host.kind,
    kernelFormat: kernel.info.format,
    kernelOrigin: kernel.origin,
    baseSource: baseImage ?? 'debian',
    linuxBootable,
    built,
    fetched,
    sources: plan.sources,
    notes,
  };
}
