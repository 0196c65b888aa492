// The rootfs phase, in two store artifacts:
//   rootfs-base: Debian bookworm from the host's own apt sources as an ext4
//     image (guest/image/build.sh; root, about a minute), keyed by the script,
//     the host's apt sources and package indexes, and mmdebstrap's version;
//   rootfs: that image plus the agent at /usr/sbin/torpor-agent
//     (guest/image/add-agent.sh; no root, under a second), keyed by the base's
//     key and the agent's hash.
import { copyFile, link, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { fetchImage } from '../image/index.js';
import { writeOneLayerLayout } from '../image/layout-writer.js';
import { imageRootfs, ROOTFS_FORMAT } from '../image/rootfs.js';
import type { ImageProgress } from '../image/types.js';
import { artifactDir, artifactKey, checkArtifact, ensureArtifact, type ArtifactOptions, type ArtifactResult } from '../store/artifact.js';
import { debianVersion } from './host-info.js';
import { imageDir } from './paths.js';
import type { ProgressSink } from './progress.js';
import { runScript } from './run-script.js';

export interface RootfsArtifact {
  path: string;
  artifact: ArtifactResult;
}

/** Parses the package list out of build.sh so the key and the script cannot disagree. */
export function imagePackages(script: string): string[] {
  const m = /^packages=\(([^)]*)\)/m.exec(script);
  if (!m) throw new TorporError('INTERNAL', 'guest/image/build.sh has no packages=(...) list');
  return m[1]!.split(/\s+/).filter(Boolean);
}

/** The host's apt sources files, as build.sh picks them (contents go into the key). */
async function aptSources(): Promise<string> {
  const files: string[] = [];
  if (process.env.APT_SOURCES) {
    // The files build.sh is told to use: their contents, not just their names, decide the image.
    files.push(...process.env.APT_SOURCES.split(/\s+/).filter(Boolean));
  } else {
    files.push('/etc/apt/sources.list');
    const dir = '/etc/apt/sources.list.d';
    for (const name of (await readdir(dir).catch(() => [] as string[])).sort()) {
      if (name.endsWith('.list') || name.endsWith('.sources')) files.push(join(dir, name));
    }
  }
  const parts: string[] = [];
  for (const f of files) parts.push(`${f}\n${await readFile(f, 'utf8').catch(() => '')}`);
  return parts.join('\n');
}

/**
 * The state of the host's package indexes (name, size, mtime of each Packages
 * file): new package versions arrive through `apt-get update`, which rewrites
 * them. Stat calls only: `apt-cache policy` costs half a second, and a setup
 * with nothing to do must finish in under one. The versions actually installed
 * are recorded in the artifact's packages.txt.
 */
async function aptIndexState(): Promise<string> {
  const dir = '/var/lib/apt/lists';
  const lines: string[] = [];
  for (const name of (await readdir(dir).catch(() => [] as string[])).sort()) {
    if (!/_Packages(\.\w+)?$/.test(name)) continue;
    const st = await stat(join(dir, name)).catch(() => undefined);
    if (st) lines.push(`${name} ${st.size} ${st.mtimeMs}`);
  }
  return lines.join('\n');
}

/** mmdebstrap's progress lines, in order, mapped to a rough percentage. */
const stages: Array<[RegExp, number, string]> = [
  [/^I: running apt-get update/, 5, 'apt-get update'],
  [/^I: downloading packages/, 15, 'downloading packages'],
  [/^I: extracting archives/, 35, 'extracting'],
  [/^I: installing essential packages/, 45, 'installing essential packages'],
  [/^I: installing remaining packages/, 65, 'installing packages'],
  [/^I: running --customize-hook/, 85, 'customizing'],
  [/^phase: mkfs/, 90, 'mkfs.ext4'],
];

export const BASE_FILES = ['base.ext4', 'packages.txt'];
export const ROOTFS_FILES = ['rootfs.ext4', 'packages.txt'];

/** Key inputs of the Debian base image (everything but the agent). */
export async function baseInputs(): Promise<Record<string, string>> {
  const [script, indexes, mmdebstrap, sources] = await Promise.all([
    readFile(join(imageDir, 'build.sh'), 'utf8'),
    aptIndexState(),
    debianVersion('mmdebstrap'),
    aptSources(),
  ]);
  return { 'build.sh': script, indexes, mmdebstrap, sources };
}

/** Key inputs of the bootable image: the base's key, the agent's hash, the script that joins them. */
export async function rootfsInputs(baseKey: string, agentSha256: string): Promise<Record<string, string>> {
  return { base: baseKey, agent: agentSha256, 'add-agent.sh': await readFile(join(imageDir, 'add-agent.sh'), 'utf8') };
}

/** True when the Debian base image is stored and intact (building it needs root and minutes). */
export async function baseIsCached(root: string, verify: boolean): Promise<boolean> {
  const inputs = await baseInputs();
  const key = artifactKey('rootfs-base', inputs);
  return (await checkArtifact(artifactDir(root, 'rootfs-base', key), key, BASE_FILES, verify)).ok;
}

/** Where the current base image lives (built or not): the nested test host copies just the current artifacts. */
export async function baseArtifactDir(root: string): Promise<string> {
  return artifactDir(root, 'rootfs-base', artifactKey('rootfs-base', await baseInputs()));
}

function storeOptions(root: string, verify: boolean, onProgress: ProgressSink | undefined, what: string): ArtifactOptions {
  return {
    root,
    verify,
    onWait: (pid) => onProgress?.({ phase: 'rootfs', status: 'note', message: `waiting for another build of the ${what} (pid ${pid ?? '?'})`, elapsedMs: 0 }),
    onDamaged: (_dir, reason) =>
      onProgress?.({ phase: 'rootfs', status: 'note', message: `stored ${what} is damaged (${reason}); rebuilding`, elapsedMs: 0 }),
  };
}

/** guest/image/build.sh with `args`, its mmdebstrap lines reported as rough percentages. */
async function runBuildScript(args: string[], what: string, started: number, onProgress: ProgressSink | undefined): Promise<void> {
  let percent = 0;
  await runScript(join(imageDir, 'build.sh'), args, {
    what,
    onLine: (line) => {
      for (const [re, p, label] of stages) {
        if (p > percent && re.test(line)) {
          percent = p;
          onProgress?.({ phase: 'rootfs', status: 'step', percent, message: label, elapsedMs: Date.now() - started });
        }
      }
    },
  });
}

export async function ensureRootfs(root: string, agent: { path: string; sha256: string }, verify: boolean, onProgress?: ProgressSink): Promise<RootfsArtifact> {
  const inputs = await baseInputs();
  const packages = imagePackages(inputs['build.sh']!);
  const started = Date.now();
  const base = await ensureArtifact(
    {
      kind: 'rootfs-base',
      inputs,
      files: BASE_FILES,
      build: async (dir) => {
        onProgress?.({ phase: 'rootfs', status: 'start', message: `Debian bookworm + ${packages.length} packages`, elapsedMs: 0 });
        await runBuildScript([dir], 'building the root filesystem', started, onProgress);
      },
    },
    storeOptions(root, verify, onProgress, 'Debian base image'),
  );
  // The agent goes in last, without mounting: a new agent costs a copy and a debugfs call.
  const artifact = await ensureArtifact(
    {
      kind: 'rootfs',
      inputs: await rootfsInputs(base.key, agent.sha256),
      files: ROOTFS_FILES,
      build: async (dir) => {
        onProgress?.({ phase: 'rootfs', status: 'step', percent: 95, message: 'adding the agent', elapsedMs: Date.now() - started });
        await runScript(join(imageDir, 'add-agent.sh'), [join(base.dir, 'base.ext4'), agent.path, join(dir, 'rootfs.ext4')], {
          what: 'adding the agent to the root filesystem',
        });
        await copyFile(join(base.dir, 'packages.txt'), join(dir, 'packages.txt'));
      },
    },
    storeOptions(root, verify, onProgress, 'root filesystem'),
  );
  return { path: join(artifact.dir, 'rootfs.ext4'), artifact };
}

export const USER_BASE_FILES = ['rootfs.ext4', 'packages.txt'];

async function userBaseInputs(agentSha256: string): Promise<Record<string, string>> {
  return { ...(await baseInputs()), agent: agentSha256, format: String(ROOTFS_FORMAT) };
}

/** True when the Debian base made without root, with this agent, is stored. */
export async function userBaseIsCached(root: string, agentSha256: string, verify: boolean): Promise<boolean> {
  const key = artifactKey('rootfs-user', await userBaseInputs(agentSha256));
  return (await checkArtifact(artifactDir(root, 'rootfs-user', key), key, USER_BASE_FILES, verify)).ok;
}

/**
 * The Debian base made without root: guest/image/build.sh --tar in mmdebstrap's unshare mode
 * (user namespaces; its tarball is the root mode's, bit for bit), then the container-image
 * pipeline (one-layer OCI layout, flattened, `mke2fs -d`, the agent injected) as any image is.
 * Keyed by the Debian base's own inputs and the agent.
 */
export async function ensureRootfsUnshare(
  home: string,
  root: string,
  agent: { path: string; sha256: string },
  verify: boolean,
  onProgress?: ProgressSink,
): Promise<RootfsArtifact> {
  const inputs = await userBaseInputs(agent.sha256);
  const packages = imagePackages(inputs['build.sh']!);
  const started = Date.now();
  const artifact = await ensureArtifact(
    {
      kind: 'rootfs-user',
      inputs,
      files: USER_BASE_FILES,
      build: async (dir) => {
        onProgress?.({ phase: 'rootfs', status: 'start', message: `Debian bookworm + ${packages.length} packages (mmdebstrap's unshare mode, no root)`, elapsedMs: 0 });
        const work = join(dir, 'build');
        await runBuildScript(['--tar', work], 'building the root filesystem (unshare mode)', started, onProgress);
        const layout = join(work, 'layout');
        // gzip -1: the layer is read once, right here; its size matters less than the time.
        await writeOneLayerLayout(join(work, 'base.tar'), layout, { tag: 'base', gzipLevel: 1, createdBy: 'torpor guest/image/build.sh --tar (unshare mode)' });
        await rm(join(work, 'base.tar'));
        const progress = (p: ImageProgress): void => {
          if (p.phase !== 'download') onProgress?.({ phase: 'rootfs', status: 'step', percent: 95, message: `${p.phase}: ${p.message}`, elapsedMs: Date.now() - started });
        };
        const image = await fetchImage({ ociLayout: layout }, { home, onProgress: progress });
        const made = await imageRootfs(image, { home, agent, onProgress: progress });
        // The image pipeline keeps its copy under TORPOR_HOME: a hard link costs nothing.
        await link(made.path, join(dir, 'rootfs.ext4')).catch(() => copyFile(made.path, join(dir, 'rootfs.ext4')));
        await rename(join(work, 'packages.txt'), join(dir, 'packages.txt'));
        await rm(work, { recursive: true, force: true });
      },
    },
    storeOptions(root, verify, onProgress, 'Debian base image (unshare mode)'),
  );
  return { path: join(artifact.dir, 'rootfs.ext4'), artifact };
}
