// A pulled image as a bootable root filesystem, cached in the store:
//   <home>/images/rootfs/<key>/rootfs.ext4   (read-only once in place)
//   <home>/images/rootfs/<key>/info.json     (sizes, what went in)
// keyed by the image's config and layer digests, the agent's hash, the size
// asked for and this code's format (ROOTFS_FORMAT, mke2fs's version, the
// add-agent script). Built in a temporary directory beside it, under a lock
// taken across processes, and renamed into place only when complete: a failed
// or killed build leaves nothing a later call would use, and is retried cleanly.
import { createWriteStream } from 'node:fs';
import { chmod, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { imageDir } from '../setup/paths.js';
import { storeError } from '../store/artifact.js';
import { fsyncPath } from '../store/fsync.js';
import { sha256 } from '../store/hash.js';
import { torporHome } from '../store/home.js';
import { acquireLock } from '../store/lock.js';
import { processAlive } from '../store/process-alive.js';
import { buildRootfsExt4, checkMke2fs } from './ext4.js';
import { flattenLayers } from './flatten.js';
import type { ImageProgress, PulledImage } from './types.js';

/** Bump when flatten.ts or ext4.ts change what they produce from the same layers. */
export const ROOTFS_FORMAT = 1;

/** Directories the guest needs at boot (the agent mounts on them; it mkdirs them too, but a read-only root could not). */
export const BOOT_DIRS: Array<{ path: string; mode: number }> = [
  { path: 'proc', mode: 0o555 },
  { path: 'sys', mode: 0o555 },
  { path: 'dev', mode: 0o755 },
  { path: 'tmp', mode: 0o1777 },
  { path: 'run', mode: 0o755 },
  { path: 'etc', mode: 0o755 },
  { path: 'root', mode: 0o700 },
  // Where the agent goes (add-agent.sh writes /usr/sbin/torpor-agent).
  { path: 'usr', mode: 0o755 },
  { path: 'usr/sbin', mode: 0o755 },
];

export interface ImageRootfsOptions {
  /** The torpor home (default: torporHome()). */
  home?: string;
  /** The image's size; default: its content plus metadata plus 1 GiB free. */
  sizeMiB?: number;
  agent: { path: string; sha256: string };
  onProgress?: (p: ImageProgress) => void;
}

export interface ImageRootfs {
  path: string;
  sizeMiB: number;
  /** Bytes of file data the image's layers put in it. */
  contentBytes: number;
}

interface Info extends ImageRootfs {
  format: number;
  source: string;
  configDigest: string;
  layers: string[];
  agentSha256: string;
  mke2fs: string;
  entries: number;
  freeBytes: number;
  builtAt: string;
}

export function imageRootfsDir(home: string): string {
  return join(home, 'images', 'rootfs');
}

/** The cache key of an image's root filesystem. */
export async function imageRootfsKey(image: PulledImage, options: Pick<ImageRootfsOptions, 'sizeMiB' | 'agent'>): Promise<string> {
  const inputs = {
    format: ROOTFS_FORMAT,
    mke2fs: checkMke2fs().version,
    addAgent: sha256(await readFile(join(imageDir, 'add-agent.sh'))),
    configDigest: image.configDigest,
    layers: image.layers.map((l) => `${l.digest} ${l.mediaType}`),
    agent: options.agent.sha256,
    sizeMiB: options.sizeMiB ?? null,
  };
  return sha256(JSON.stringify(inputs)).slice(0, 32);
}

async function readInfo(dir: string): Promise<Info | undefined> {
  try {
    const info = JSON.parse(await readFile(join(dir, 'info.json'), 'utf8')) as Info;
    const st = await stat(join(dir, 'rootfs.ext4'));
    if (st.size !== info.sizeMiB * 1024 * 1024) return undefined;
    return { ...info, path: join(dir, 'rootfs.ext4') };
  } catch {
    return undefined;
  }
}

/** Removes temporary build directories of builders that died (their pid is in the name). */
async function sweepDeadBuilds(root: string): Promise<void> {
  for (const name of await readdir(root).catch(() => [] as string[])) {
    const m = /^\.tmp-[0-9a-f]+-(\d+)-/.exec(name);
    if (m && !processAlive(Number(m[1]))) await rm(join(root, name), { recursive: true, force: true }).catch(() => undefined);
  }
}

/**
 * The image's root filesystem: its layers flattened (whiteouts applied), made
 * into an ext4 with mke2fs -d (no root), the agent added as
 * /usr/sbin/torpor-agent. Built once per key; later calls return the stored one.
 */
export async function imageRootfs(image: PulledImage, options: ImageRootfsOptions): Promise<ImageRootfs> {
  const home = options.home ?? torporHome();
  const root = imageRootfsDir(home);
  if (options.sizeMiB !== undefined && (!Number.isInteger(options.sizeMiB) || options.sizeMiB <= 0)) {
    throw new TorporError('INVALID_ARGUMENT', `sizeMiB must be a positive whole number of MiB (got ${options.sizeMiB})`);
  }
  const key = await imageRootfsKey(image, options);
  const dir = join(root, key);
  const done = await readInfo(dir);
  if (done) return { path: done.path, sizeMiB: done.sizeMiB, contentBytes: done.contentBytes };
  try {
    await mkdir(root, { recursive: true });
    const lock = await acquireLock(join(root, `${key}.lock`), {
      onWait: (pid) => options.onProgress?.({ phase: 'unpack', message: `waiting for another build of this image's root filesystem (pid ${pid ?? '?'})` }),
    });
    try {
      const again = await readInfo(dir);
      if (again) return { path: again.path, sizeMiB: again.sizeMiB, contentBytes: again.contentBytes };
      // Whatever is at `dir` without a good info.json is a leftover: it goes.
      await rm(dir, { recursive: true, force: true });
      await sweepDeadBuilds(root);
      const tmp = join(root, `.tmp-${key}-${process.pid}-${Date.now().toString(36)}`);
      await mkdir(tmp);
      try {
        const info = await build(image, options, tmp);
        await writeFile(join(tmp, 'info.json'), JSON.stringify({ ...info, path: undefined }, null, 2) + '\n');
        await fsyncPath(join(tmp, 'info.json'));
        await fsyncPath(tmp);
        await rename(tmp, dir);
        await fsyncPath(root);
        return { path: join(dir, 'rootfs.ext4'), sizeMiB: info.sizeMiB, contentBytes: info.contentBytes };
      } catch (err) {
        await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
        throw err;
      }
    } finally {
      await lock.release();
    }
  } catch (err) {
    throw storeError(err, root);
  }
}

async function build(image: PulledImage, options: ImageRootfsOptions, tmp: string): Promise<Info> {
  const progress = options.onProgress;
  const tarPath = join(tmp, 'rootfs.tar');
  const out = createWriteStream(tarPath, { highWaterMark: 1 << 20 });
  let lastReport = 0;
  const stats = await flattenLayers(
    image.layers.map((l) => ({ path: l.path, mediaType: l.mediaType, digest: l.digest })),
    out,
    {
      ensureDirs: BOOT_DIRS,
      onProgress: progress
        ? (p) => {
            const now = Date.now();
            if (now - lastReport < 250) return;
            lastReport = now;
            progress({ phase: 'unpack', message: `${p.pass === 1 ? 'reading' : 'copying'} layer ${p.layer + 1}/${p.layers}`, bytes: p.bytes });
          }
        : undefined,
    },
  );
  progress?.({ phase: 'unpack', message: `${stats.entries} entries, ${stats.dataBytes} bytes of files` });
  progress?.({ phase: 'ext4', message: 'mke2fs -d' });
  const imagePath = join(tmp, 'rootfs.ext4');
  const ext4 = await buildRootfsExt4(tarPath, imagePath, {
    sizeMiB: options.sizeMiB,
    agentPath: options.agent.path,
    content: stats,
    xattrs: stats.xattrs,
  });
  await rm(tarPath, { force: true });
  // Read-only from here on: a VMM opens it O_RDONLY; sandboxes get copies.
  await chmod(imagePath, 0o444);
  await fsyncPath(imagePath);
  progress?.({ phase: 'ext4', message: `${ext4.sizeMiB} MiB, ${Math.round(ext4.freeBytes / 1048576)} MiB free` });
  return {
    path: imagePath,
    sizeMiB: ext4.sizeMiB,
    contentBytes: stats.dataBytes,
    format: ROOTFS_FORMAT,
    source: image.source,
    configDigest: image.configDigest,
    layers: image.layers.map((l) => l.digest),
    agentSha256: options.agent.sha256,
    mke2fs: ext4.mke2fs,
    entries: stats.entries,
    freeBytes: ext4.freeBytes,
    builtAt: new Date().toISOString(),
  };
}
