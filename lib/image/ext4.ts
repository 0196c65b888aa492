// A flattened image tar (lib/image/flatten.ts) as a bootable ext4, without root:
// mke2fs >= 1.47.1 fills a file system from a tarball (`mke2fs -d rootfs.tar`,
// through libarchive), taking ownership, modes, device numbers and xattrs from
// the tar headers, so no file is ever created on the host. The agent then goes
// in as /usr/sbin/torpor-agent (root:root 0755) with debugfs, by the same
// script as the Debian base image (guest/image/add-agent.sh --in-place).
//
// The file system is made as guest/image/build.sh makes the base one: 4 KiB
// blocks, no reserved blocks, label torpor-root, a fixed UUID and directory
// hash seed (the same tar gives the same image), as a sparse file: the free
// space costs no host disk until the guest writes to it.
import { spawn, spawnSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { mkdtemp, open, rm, stat, truncate, unlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';

import { TorporError } from '../errors.js';
import { imageDir } from '../setup/paths.js';
import { runScript } from '../setup/run-script.js';

/** mke2fs reads a tarball given to -d from this version on. */
export const MKE2FS_MIN: [number, number, number] = [1, 47, 1];

const UUID = '5b1f7a0e-3c2d-4e6f-9a8b-7c6d5e4f3a2b';
const HASH_SEED = '0f1e2d3c-4b5a-4968-8776-655443322110';
const MiB = 1 << 20;

export interface Ext4Options {
  /** The image's whole size. Default: the content plus metadata plus freeMiB. */
  sizeMiB?: number;
  /** Free space wanted for the guest's own files when sizeMiB is not given (default 1024). */
  freeMiB?: number;
  /** The static guest agent written as /usr/sbin/torpor-agent. */
  agentPath: string;
  /** What the tar holds (flatten's stats); read from the tar when absent. */
  content?: { blocks4k: number; entries: number };
  /**
   * The tar's xattrs (flatten's stats.xattrs). mke2fs -d copies only
   * security.capability (and gnu.translator) from a tarball; the rest are set
   * here with debugfs ea_set. Without this list only those two survive.
   */
  xattrs?: Array<{ path: string; name: string; value: Buffer }>;
}

/** The xattrs mke2fs -d takes from a tarball itself (misc/create_inode_libarchive.c, set_inode_xattr_tar). */
const MKE2FS_TAR_XATTRS = new Set(['security.capability', 'gnu.translator']);

/** Sets xattrs with one debugfs session (values through files: they may be binary). */
async function setXattrs(image: string, xattrs: Array<{ path: string; name: string; value: Buffer }>): Promise<void> {
  if (!xattrs.length) return;
  const dir = await mkdtemp(join(dirname(image), '.xattrs-'));
  try {
    const lines: string[] = [];
    for (let i = 0; i < xattrs.length; i++) {
      const { path, name, value } = xattrs[i]!;
      if (/["\n\\]/.test(path) || /[\s"\\]/.test(name)) {
        throw new TorporError('IMAGE_INVALID', `xattr ${JSON.stringify(name)} on ${JSON.stringify(path)}: a name debugfs cannot take`);
      }
      const file = join(dir, String(i));
      await writeFile(file, value);
      lines.push(`ea_set -f ${file} "/${path}" ${name}`);
    }
    const r = spawnSync(toolPath('debugfs'), ['-w', '-f', '-', image], { input: lines.join('\n') + '\n', encoding: 'utf8', maxBuffer: 64 << 20 });
    const errors = (r.stderr ?? '').split('\n').filter((l) => l.trim() && !/^debugfs \d/.test(l));
    if (r.status !== 0 || errors.length) {
      throw new TorporError('IMAGE_INVALID', `setting the image's xattrs with debugfs failed: ${errors.slice(0, 5).join('; ') || `exit ${r.status}`}`);
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

export interface Ext4Result {
  sizeMiB: number;
  /** Bytes the content occupies in the file system (blocks in use * block size, after the agent). */
  usedBytes: number;
  freeBytes: number;
  inodes: number;
  mke2fs: string;
}

const mke2fsChecked = new Map<string, { version: string; path: string }>();

/** `name` on $PATH, then in /usr/sbin and /sbin (e2fsprogs' home, often not on a user's PATH). */
function toolPath(name: string): string {
  for (const dir of (process.env.PATH ?? '').split(':').concat(['/usr/sbin', '/sbin'])) {
    if (!dir) continue;
    const p = join(dir, name);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      // not here
    }
  }
  return name;
}

/** mke2fs's version ('1.47.2'), or MISSING_TOOLS when it is absent or cannot read a tarball. */
export function checkMke2fs(): { version: string; path: string } {
  const path = toolPath('mke2fs');
  const known = mke2fsChecked.get(path);
  if (known) return known;
  const r = spawnSync(path, ['-V'], { encoding: 'utf8' });
  const m = /mke2fs (\d+)\.(\d+)(?:\.(\d+))?/.exec(`${r.stdout ?? ''}${r.stderr ?? ''}`);
  if (r.error || !m) {
    throw new TorporError('MISSING_TOOLS', 'building a root filesystem from an image needs mke2fs (e2fsprogs >= 1.47.1); it is not installed');
  }
  const have = [Number(m[1]), Number(m[2]), Number(m[3] ?? 0)];
  const version = have.join('.');
  for (let i = 0; i < 3; i++) {
    if (have[i]! > MKE2FS_MIN[i]!) break;
    if (have[i]! < MKE2FS_MIN[i]!) {
      throw new TorporError(
        'MISSING_TOOLS',
        `building a root filesystem from an image needs mke2fs >= ${MKE2FS_MIN.join('.')} (it fills the file system from a tarball, ` +
          `keeping ownership, without root); this host has ${version}. On Debian bookworm: ` +
          'apt-get install -t bookworm-backports e2fsprogs (with bookworm-backports in the apt sources), and libarchive13.',
      );
    }
  }
  const found = { version, path };
  mke2fsChecked.set(path, found);
  return found;
}

/** What a tar holds, in ext4 terms, from its headers (when flatten's stats are not at hand). */
async function scanTar(tarPath: string): Promise<{ blocks4k: number; entries: number }> {
  const tar = await import('tar-stream');
  const { createReadStream } = await import('node:fs');
  const extract = tar.extract();
  createReadStream(tarPath, { highWaterMark: 1 << 20 }).pipe(extract as unknown as NodeJS.WritableStream);
  let blocks4k = 0;
  let entries = 0;
  for await (const entry of extract) {
    entries++;
    const h = entry.header;
    if (h.type === 'file') blocks4k += Math.ceil(h.size / 4096);
    else if (h.type === 'directory') blocks4k++;
    else if (h.type === 'symlink' && (h.linkname ?? '').length >= 60) blocks4k++;
    entry.resume();
  }
  return { blocks4k, entries };
}

/** The superblock's free blocks, block size and inode count (dumpe2fs -h). */
export function superblock(image: string): { blockSize: number; blocks: number; freeBlocks: number; inodes: number } {
  const r = spawnSync(toolPath('dumpe2fs'), ['-h', image], { encoding: 'utf8' });
  const field = (name: string): number => {
    const m = new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(r.stdout ?? '');
    if (!m) throw new TorporError('INTERNAL', `dumpe2fs -h ${image}: no '${name}' (${(r.stderr ?? '').trim()})`);
    return Number(m[1]);
  };
  return { blockSize: field('Block size'), blocks: field('Block count'), freeBlocks: field('Free blocks'), inodes: field('Inode count') };
}

/** ext4's default journal for a file system of `blocks` 4 KiB blocks (libext2fs ext2fs_default_journal_size). */
function journalBlocks(blocks: number): number {
  if (blocks < 32768) return 1024;
  if (blocks < 256 * 1024) return 4096;
  if (blocks < 512 * 1024) return 8192;
  if (blocks < 4096 * 1024) return 16384;
  if (blocks < 8192 * 1024) return 32768;
  if (blocks < 16384 * 1024) return 65536;
  if (blocks < 32768 * 1024) return 131072;
  return 262144;
}

function mke2fsRun(path: string, args: string[]): Promise<{ code: number | string; output: string }> {
  return new Promise((resolve, reject) => {
    // libarchive converts tar names to the locale's charset: under C/POSIX a non-ASCII (UTF-8)
    // name or link target is refused ("Linkname can't be converted from UTF-8"). Names are bytes
    // to ext4; C.UTF-8 (built into glibc) passes UTF-8 through unchanged.
    const child = spawn(path, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, LC_ALL: 'C.UTF-8' } });
    let output = '';
    const keep = (d: Buffer): void => void (output = (output + d.toString()).slice(-4000));
    child.stdout.on('data', keep);
    child.stderr.on('data', keep);
    child.on('error', reject);
    child.on('close', (code, signal) => resolve({ code: code ?? signal ?? -1, output }));
  });
}

/**
 * Builds `outImage` (overwritten) from the flattened tar at `tarPath` and writes
 * the agent into it. MISSING_TOOLS when mke2fs is too old; OUT_OF_SPACE when
 * the content does not fit `sizeMiB`.
 */
export async function buildRootfsExt4(tarPath: string, outImage: string, options: Ext4Options): Promise<Ext4Result> {
  const { version, path: mke2fs } = checkMke2fs();
  await stat(options.agentPath).catch((err: unknown) => {
    throw new TorporError('FILE_NOT_FOUND', `guest agent ${options.agentPath} is missing`, { cause: err });
  });
  const content = options.content ?? (await scanTar(tarPath));
  const agentBlocks = Math.ceil((await stat(options.agentPath)).size / 4096) + 2;
  // Inodes: what the image holds, and as many again (at least 64 Ki) for the guest's files.
  const inodes = content.entries + Math.max(65536, content.entries) + 16;
  const contentBlocks = content.blocks4k + agentBlocks;
  // Metadata besides the journal: inode tables (256 B each), bitmaps, group
  // descriptors and the blocks reserved for resizing: a few percent; 5% + 16 MiB.
  const metaBlocks = (blocks: number): number => Math.ceil((inodes * 256) / 4096) + Math.ceil(blocks * 0.05) + 4096 + journalBlocks(blocks);
  const needBlocks = (free: number): number => {
    let blocks = contentBlocks + free;
    for (let i = 0; i < 3; i++) blocks = contentBlocks + free + metaBlocks(blocks);
    return blocks;
  };
  const minMiB = Math.ceil((needBlocks(0) * 4096) / MiB);
  let sizeMiB: number;
  if (options.sizeMiB !== undefined) {
    if (!Number.isInteger(options.sizeMiB) || options.sizeMiB <= 0) {
      throw new TorporError('INVALID_ARGUMENT', `sizeMiB must be a positive whole number of MiB (got ${options.sizeMiB})`);
    }
    if (options.sizeMiB < minMiB) {
      throw new TorporError('OUT_OF_SPACE', `the image's files need a root filesystem of at least ${minMiB} MiB; sizeMiB is ${options.sizeMiB}`);
    }
    sizeMiB = options.sizeMiB;
  } else {
    const freeMiB = options.freeMiB ?? 1024;
    sizeMiB = Math.ceil((needBlocks(Math.ceil((freeMiB * MiB) / 4096)) * 4096) / MiB);
  }

  // A fresh sparse file of the size (mke2fs writes only the metadata and the content).
  await unlink(outImage).catch(() => undefined);
  await (await open(outImage, 'wx', 0o644)).close();
  await truncate(outImage, sizeMiB * MiB);
  const args = [
    '-q', '-F', '-t', 'ext4', '-b', '4096', '-m', '0', '-L', 'torpor-root', '-U', UUID,
    '-E', `hash_seed=${HASH_SEED},root_owner=0:0`, '-N', String(inodes), '-d', tarPath, outImage,
  ];
  const r = await mke2fsRun(mke2fs, args);
  if (r.code !== 0) {
    const out = r.output.trim();
    if (/libarchive/i.test(out)) {
      throw new TorporError('MISSING_TOOLS', `mke2fs ${version} cannot read tarballs on this host (install libarchive13): ${out}`);
    }
    if (/could not allocate|no space|not enough space|too many files|inodes/i.test(out)) {
      throw new TorporError('OUT_OF_SPACE', `the image's files do not fit a ${sizeMiB} MiB root filesystem: ${out}`);
    }
    throw new TorporError('IMAGE_INVALID', `mke2fs -d could not build the root filesystem from the image (exit ${r.code}): ${out}`);
  }
  await setXattrs(outImage, (options.xattrs ?? []).filter((x) => !MKE2FS_TAR_XATTRS.has(x.name)));
  await runScript(join(imageDir, 'add-agent.sh'), ['--in-place', outImage, options.agentPath], {
    what: 'adding the agent to the image root filesystem',
  });
  const sb = superblock(outImage);
  const freeBytes = sb.freeBlocks * sb.blockSize;
  if (options.sizeMiB === undefined && freeBytes < (options.freeMiB ?? 1024) * MiB) {
    throw new TorporError('INTERNAL', `the root filesystem came out with ${Math.floor(freeBytes / MiB)} MiB free, under the ${options.freeMiB ?? 1024} MiB planned`);
  }
  return { sizeMiB, usedBytes: (sb.blocks - sb.freeBlocks) * sb.blockSize, freeBytes, inodes: sb.inodes, mke2fs: version };
}
