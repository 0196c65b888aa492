// Warm templates (docs/architecture.md#memory-and-disk-layers, docs/sandbox-lifecycle.md "Templates"): a guest booted once to
// agent-ready, synced and captured; every Sandbox.create with the same inputs restores it into
// the sandbox's own directory instead of booting.
//
//   templates/<name>/<key>/          one template: the inputs it was booted with (the key)
//     build.lock                     held while a build runs (one builder across processes)
//     current                        the name of the build in use ("b-<ms>-<hex>")
//     b-<ms>-<hex>/                  a build: gen-1/{vm.state, mem.layer, disk0.overlay}, current,
//                                    template.json; read-only once renamed into place
//
// key: a hash of everything the warm image depends on: kernel and root filesystem (path and
// identity: inode, size, mtime), command line (with cmdlineExtra and the network entry),
// vCPUs, memory, whether there is a network device, the warm-up commands (WARM_UP). The agent
// is inside the root filesystem.
//
// A build is never rewritten or removed: sandboxes restored from it name its memory and disk
// layers by absolute path. One that cannot be restored any more (SNAPSHOT_INVALID: a changed
// file; SNAPSHOT_INCOMPATIBLE: another host) is replaced by a new build beside it (`current`
// switched), so sandboxes still using the old one keep their files.
import { createHash } from 'node:crypto';
import { chmod, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import type { AgentClient } from '../agent/client.js';
import { TorporError } from '../errors.js';
import { macFor, type ResolvedNetwork } from '../net/options.js';
import { fsyncPath, replaceFileDurably } from '../store/fsync.js';
import { homeLayout, torporHome } from '../store/home.js';
import { acquireLock } from '../store/lock.js';
import { isPlainRelativePath } from '../store/snapshot-files.js';
import { createAgentApi } from './agent-api.js';
import { syncGuest } from './guest-requests.js';
import { GuestRun } from './guest-run.js';
import { guestMachineOptions } from './readiness.js';
import { UndoStack } from './undo-stack.js';
import { randomHex } from '../random.js';

/** What a template is booted with: the inputs its key hashes. */
export interface TemplateInputs {
  name: string;
  kernel: string;
  rootfs: string;
  cmdline: string;
  vcpus: number;
  memoryMiB: number;
  /** Whether the guest has a network device (its backend is per sandbox). */
  net: boolean;
}

/** A template build ready to restore. */
export interface TemplateBuild {
  name: string;
  key: string;
  /** The build's directory (Machine.restore's source). */
  dir: string;
  /** Its frozen disk layers, absolute, oldest first (a sandbox's meta.json diskLayers start with them). */
  diskLayers: string[];
  /** The network device's MAC every sandbox restored from it keeps ('' without a network). */
  mac: string;
}

const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const BUILD_PATTERN = /^b-\d{1,16}-[0-9a-f]{8}$/;
/** The network a template is booted with: passt's defaults; each sandbox gets its own later. */
const BUILD_NETWORK: ResolvedNetwork = { egress: true, allowHostLoopback: false, ports: [] };
/** How long the guest has to answer SYNC before the template is captured. */
const SYNC_TIMEOUT_MS = 30_000;
/**
 * Run once in the template before its capture (an agent that offers exec; the test guest does
 * not): what a sandbox's first commands read (bash, the C library, python3 and its standard
 * library) is then in the template's page cache, shared by every sandbox, instead of being read
 * again by each one, and written again into each one's first pause. Failures are ignored (a root
 * filesystem without python3).
 */
const WARM_UP = ['true', 'python3 -c pass'];
const WARM_UP_TIMEOUT_MS = 60_000;

export function checkTemplateName(name: string): void {
  if (!NAME_PATTERN.test(name)) throw new TorporError('INVALID_ARGUMENT', `a template name is letters, digits, '.', '_' and '-' (got ${JSON.stringify(name)})`);
}

async function identity(path: string): Promise<string> {
  const st = await stat(path);
  return `${st.ino}:${st.size}:${st.mtimeMs}`;
}

/** The key of the template booted with `inputs` (reads the kernel's and the root filesystem's identity). */
export async function templateKey(inputs: TemplateInputs): Promise<string> {
  const h = createHash('sha256');
  h.update(
    JSON.stringify({
      v: 1,
      kernel: [inputs.kernel, await identity(inputs.kernel)],
      rootfs: [inputs.rootfs, await identity(inputs.rootfs)],
      cmdline: inputs.cmdline,
      vcpus: inputs.vcpus,
      memoryMiB: inputs.memoryMiB,
      net: inputs.net,
      warmUp: WARM_UP,
    }),
  );
  return h.digest('hex').slice(0, 32);
}

/** templates/<name>/<key>/ under the current TORPOR_HOME. */
export function templateRoot(name: string, key: string, home: string = torporHome()): string {
  return join(homeLayout(home).templates, name, key);
}

async function readBuild(root: string, name: string, key: string): Promise<TemplateBuild | null> {
  let current: string;
  try {
    current = (await readFile(join(root, 'current'), 'utf8')).trim();
  } catch {
    return null;
  }
  if (!BUILD_PATTERN.test(current)) return null;
  const dir = join(root, current);
  let record: { diskLayers?: unknown; mac?: unknown };
  try {
    record = JSON.parse(await readFile(join(dir, 'template.json'), 'utf8')) as typeof record;
  } catch {
    return null;
  }
  const layers = record.diskLayers;
  if (!Array.isArray(layers) || !layers.every(isPlainRelativePath)) return null;
  if (typeof record.mac !== 'string') return null;
  return { name, key, dir, diskLayers: layers.map((p: string) => join(dir, p)), mac: record.mac };
}

/** Files of a finished build: read-only for everyone (a sign; the loader checks them anyway). */
export async function freeze(dir: string): Promise<void> {
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    if (entry.isDirectory()) await freeze(p);
    else await chmod(p, 0o444);
  }
}

/**
 * Boots the guest with `inputs`, waits for its agent, SYNCs, captures it (stopped) into a
 * temporary directory beside the builds and renames it into place. Returns the build's name.
 */
async function build(inputs: TemplateInputs, root: string, key: string, bootTimeoutMs: number): Promise<string> {
  const buildName = `b-${Date.now()}-${randomHex(4)}`;
  const tmp = join(root, `.tmp-${buildName}-${process.pid}`);
  await mkdir(tmp, { recursive: true });
  const mac = inputs.net ? macFor(`template:${inputs.name}:${key}`) : '';
  const undo = new UndoStack();
  undo.defer(() => rm(tmp, { recursive: true, force: true }));
  try {
    const options = guestMachineOptions(inputs, { base: inputs.rootfs, overlay: join(tmp, 'overlay') }, inputs.net ? { net: { mac } } : {});
    const guest = await GuestRun.boot(options, { network: inputs.net && BUILD_NETWORK, agentTimeoutMs: bootTimeoutMs });
    undo.defer(() => guest.stop());
    await warmUp(guest.client);
    await syncGuest(guest.client, SYNC_TIMEOUT_MS);
    const snap = await guest.capture(tmp);
    // Only the generation stays: the first top (hard-linked into gen-1) and the new one are nobody's.
    await rm(join(tmp, 'tops'), { recursive: true, force: true });
    await rm(join(tmp, 'overlay'), { force: true });
    await rm(join(tmp, 'overlay.map'), { force: true });
    const record = { name: inputs.name, key, createdAt: new Date().toISOString(), inputs, diskLayers: snap.diskLayers[0] ?? [], mac };
    await writeFile(join(tmp, 'template.json'), JSON.stringify(record, null, 2) + '\n');
    await freeze(tmp);
    await fsyncPath(tmp);
    await rename(tmp, join(root, buildName));
    await fsyncPath(root);
    undo.move();
    return buildName;
  } catch (err) {
    await undo.disposeAsync().catch(() => undefined);
    throw err;
  }
}

async function warmUp(client: AgentClient): Promise<void> {
  if (!client.supports('exec')) return;
  const { commands } = createAgentApi(client);
  for (const command of WARM_UP) await commands.run(command, { timeoutMs: WARM_UP_TIMEOUT_MS }).catch(() => undefined);
}

function switchCurrent(root: string, buildName: string): Promise<void> {
  return replaceFileDurably(join(root, 'current'), buildName + '\n');
}

/**
 * The template for `inputs`: the current build, or a new one (one builder at a time across
 * processes: the others wait on build.lock, then use what it built). `replacing`: a build that
 * could not be restored; a new one is made unless another process replaced it already.
 * `built` says whether this call booted one.
 */
export async function ensureTemplate(
  inputs: TemplateInputs,
  opts: { bootTimeoutMs: number; replacing?: TemplateBuild },
): Promise<{ template: TemplateBuild; built: boolean }> {
  checkTemplateName(inputs.name);
  const key = await templateKey(inputs);
  const root = templateRoot(inputs.name, key);
  const usable = (b: TemplateBuild | null): b is TemplateBuild => b !== null && b.dir !== opts.replacing?.dir;
  const found = await readBuild(root, inputs.name, key);
  if (usable(found)) return { template: found, built: false };
  await mkdir(root, { recursive: true });
  const lock = await acquireLock(join(root, 'build.lock'));
  try {
    const now = await readBuild(root, inputs.name, key);
    if (usable(now)) return { template: now, built: false };
    const buildName = await build(inputs, root, key, opts.bootTimeoutMs);
    await switchCurrent(root, buildName);
    const made = await readBuild(root, inputs.name, key);
    if (!made) throw new TorporError('INTERNAL', `the template build ${join(root, buildName)} is not readable after it was made`);
    return { template: made, built: true };
  } finally {
    await lock.release();
  }
}

/** Whether a failed restore of a template says the build itself is unusable (then it is replaced). */
export function isBrokenTemplate(err: unknown): boolean {
  if (!(err instanceof TorporError)) return false;
  return err.code === 'SNAPSHOT_INVALID' || err.code === 'SNAPSHOT_INCOMPATIBLE' || err.code === 'IO_ERROR';
}
