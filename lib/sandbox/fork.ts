// sbx.fork(n) (docs/sandbox-lifecycle.md#fork): n new sandboxes continuing a running one.
//
//   1. The parent is captured into its next generation while it runs on (captureLive, as a
//      checkpoint is, without the record).
//   2. That generation's files are hard-linked into a fork base, templates/.forks/f-<ms>-<hex>/,
//      at the same relative paths (the state names its layers relative to its directory): the
//      children name its layers by absolute path as a template's sandboxes do, and whatever the
//      parent does next (pause, prune, restore a checkpoint, kill) removes only its own links.
//      A generation's files are never rewritten, so sharing their inodes is safe.
//   3. Each child is a sandbox of its own (id, directory, owner lock, meta.json, network backend)
//      restored from the fork base into its directory, as from a template: its memory is the
//      base's mapped copy-on-write, its disk a top layer of its own, and RESUMED gives it the
//      host's clock and fresh entropy before anything else runs. Less than a create does: one
//      meta.json, once it runs (no 'starting' one for a start of milliseconds), and RESUMED
//      written behind the HELLO (the child's agent is the parent's, its HELLO known).
// The fork base goes when the last sandbox using it is killed (or by `torpor prune`).
import { copyFile, link, mkdir, readdir, rm, stat } from 'node:fs/promises';
import { dirname, isAbsolute, join } from 'node:path';

import type { AgentHello } from '../agent/connection.js';
import { homeLayout } from '../store/home.js';
import { SandboxDir, newSandboxId, sandboxIds, type SandboxMeta } from '../store/sandbox-dir.js';
import { readGenerationFiles, writeCurrent } from '../store/snapshot-files.js';
import { startInNewDir, type NewSandbox } from './create.js';
import { restoreInto } from './template-start.js';
import type { TemplateBuild } from './template.js';
import { randomHex } from '../random.js';

/** Where fork bases live: under templates/, so that sandboxes may name their layers (meta.json
 *  accepts a template's layers by absolute path), in a directory no template name can take. */
export function forksRoot(home?: string): string {
  return join(homeLayout(home).templates, '.forks');
}

/** A fork base made from generation `generation` of `parent`: its files hard-linked (copied
 *  where the filesystem cannot link) into a new directory whose `current` names it. */
export async function makeForkBase(parent: SandboxDir, generation: number, mac: string): Promise<TemplateBuild> {
  const files = readGenerationFiles(parent.snapshots, generation);
  const base = join(forksRoot(), `f-${Date.now()}-${randomHex(4)}`);
  const own = (p: string) => !isAbsolute(p);
  const wanted = [files.manifest, files.state, ...files.memoryLayers, ...(files.disks ?? []).flat().flatMap((p) => [p, `${p}.map`])].filter(own);
  try {
    // The directories first, then every link at once (each a round on the thread pool).
    for (const d of new Set(wanted.map((p) => dirname(join(base, p))))) await mkdir(d, { recursive: true });
    await Promise.all(
      [...new Set(wanted)].map(async (p) => {
        const from = join(parent.snapshots, p);
        if (p.endsWith('.map') && !(await stat(from).then(() => true, () => false))) return;
        await linkOrCopy(from, join(base, p));
      }),
    );
    await writeCurrent(base, generation);
  } catch (err) {
    await rm(base, { recursive: true, force: true }).catch(() => undefined);
    throw err;
  }
  const disk = files.disks?.[0] ?? [];
  return { name: `fork of ${parent.id}`, key: '', dir: base, diskLayers: disk.map((p) => (isAbsolute(p) ? p : join(base, p))), mac };
}

/** A hard link, or a copy where the two paths are on different filesystems (EXDEV). */
async function linkOrCopy(from: string, to: string): Promise<void> {
  try {
    await link(from, to);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EXDEV') throw err;
    await copyFile(from, to);
  }
}

/** What a child keeps of its parent's meta.json: what it is (template, kernel, root filesystem,
 *  size, environment, network, lifecycle), not where the parent stands. */
function childMeta(parent: SandboxMeta, dir: SandboxDir, base: string): SandboxMeta {
  const meta: SandboxMeta = {
    id: dir.id,
    template: parent.template,
    createdAt: new Date().toISOString(),
    vcpus: parent.vcpus,
    memoryMiB: parent.memoryMiB,
    metadata: { ...parent.metadata },
    envs: { ...parent.envs },
    kernel: parent.kernel,
    rootfs: parent.rootfs,
    cmdline: parent.cmdline,
    ownerPid: process.pid,
    state: 'starting',
    // The base, named in the one meta.json a child writes ('running'). Before that the child's
    // directory has none, which keeps every fork base from `torpor prune` (forkBaseUnused).
    createdFrom: 'fork',
    forkedFrom: parent.id,
    templateBuild: base,
  };
  for (const k of ['diskMb', 'defaults', 'templateLayers', 'timeoutMs', 'onTimeout', 'autoResume', 'network'] as const) {
    if (parent[k] !== undefined) (meta as unknown as Record<string, unknown>)[k] = parent[k];
  }
  return meta;
}

/** One child of a fork: its directory and lock, its machine restored from `base`, its meta.json.
 *  `agentHello`: the parent's agent's HELLO (the child's agent is that one). */
export async function startChild(base: TemplateBuild, parent: SandboxMeta, agentMs: number, agentHello: AgentHello): Promise<NewSandbox> {
  const dir = new SandboxDir(newSandboxId());
  const meta = childMeta(parent, dir, base.dir);
  return startInNewDir(
    dir,
    meta,
    // The child runs the parent's agent (its memory): RESUMED goes out behind the HELLO.
    () => restoreInto(base, dir, meta.network ?? false, agentMs, undefined, agentHello),
    async (started) => ({ diskLayers: started.diskLayers }),
    { starting: false },
  );
}

/** Removes a fork base no sandbox uses any more (nor names a layer of). Best effort: a base kept
 *  is only disk, which `torpor prune` finds again. */
export async function dropForkBaseIfUnused(base: string | undefined): Promise<boolean> {
  if (!base || !(await forkBaseUnused(base))) return false;
  await rm(base, { recursive: true, force: true });
  return true;
}

/** Whether `base` is a fork base no sandbox uses (a sandbox whose meta.json cannot be read might),
 *  leaving out the sandboxes `ignoring` names (a dry run of `torpor prune`: those it would remove). */
export async function forkBaseUnused(base: string, ignoring: ReadonlySet<string> = new Set()): Promise<boolean> {
  if (!base.startsWith(forksRoot() + '/')) return false;
  const under = (p: string | undefined) => p !== undefined && (p === base || p.startsWith(base + '/'));
  for (const id of await sandboxIds()) {
    if (ignoring.has(id)) continue;
    const meta = await new SandboxDir(id).readMeta().catch(() => undefined);
    if (!meta) return false;
    if (under(meta.templateBuild) || (meta.diskLayers ?? []).some(under) || (meta.templateLayers ?? []).some(under)) return false;
  }
  return true;
}

/** Every fork base under templates/.forks/ (torpor prune's candidates). */
export async function forkBases(): Promise<string[]> {
  const root = forksRoot();
  return (await readdir(root).catch(() => [] as string[])).filter((n) => n.startsWith('f-')).map((n) => join(root, n));
}
