// Content-addressed build artifacts: artifacts/<kind>/<key>/ under the torpor home.
//
// The key is the sha256 of everything that determines the output (config text,
// scripts, package versions, the agent binary's hash), so a changed input
// yields a new directory and an unchanged one is found again without building.
// A build runs in a temporary directory beside its target, under a per-key
// lock, and is renamed into place only when complete; manifest.json records
// each file's size, mtime and hashes, checked on every use, and the files are
// made read-only. A damaged artifact (or a directory that lost its manifest)
// is moved aside and rebuilt as new files, never handed to a VMM; a machine
// still holding the old files open keeps them (unlinked, not rewritten).
import { chmod, lstat, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { headHash, sha256, sha256File } from './hash.js';
import { acquireLock } from './lock.js';
import { fsyncPath } from './fsync.js';
import { processAlive } from './process-alive.js';
import { readMounts } from '../host/mounts.js';
import { randomHex } from '../random.js';

export const MANIFEST = 'manifest.json';
const MANIFEST_VERSION = 1;

/** One input to a key: its name and either its content or an already computed hash. */
export type KeyInputs = Record<string, string | Uint8Array>;

export interface ArtifactSpec {
  /** artifacts/<kind>/: kernel, rootfs, agent, ... */
  kind: string;
  /** Everything the output depends on. */
  inputs: KeyInputs;
  /** Output files (relative to the artifact directory) the build must produce; all are recorded and checked. */
  files: string[];
  /** Writes `files` into dir (a fresh, empty temporary directory). */
  build: (dir: string) => Promise<void>;
}

export interface ArtifactOptions {
  /** The artifacts root (homeLayout().artifacts). */
  root: string;
  /** Hash every file in full instead of the cheap check. */
  verify?: boolean;
  /** Another process holds the build lock for this artifact. */
  onWait?: (ownerPid: number | undefined) => void;
  /** A recorded artifact failed its check and is being rebuilt. */
  onDamaged?: (dir: string, reason: string) => void;
}

export interface FileRecord {
  size: number;
  mtimeMs: number;
  sha256: string;
  headHash: string;
}

export interface Manifest {
  version: number;
  kind: string;
  key: string;
  /** sha256 of each named input, so `why was this rebuilt` can be answered. */
  inputs: Record<string, string>;
  files: Record<string, FileRecord>;
  createdAt: string;
  buildMs: number;
}

export interface ArtifactResult {
  dir: string;
  key: string;
  manifest: Manifest;
  /** True when this call ran the build. */
  built: boolean;
}

/** Hashes of each input, by name. */
export function inputHashes(inputs: KeyInputs): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of Object.keys(inputs).sort()) out[name] = sha256(inputs[name]!);
  return out;
}

/** The artifact key: sha256 over the kind and the sorted (name, input hash) pairs. */
export function artifactKey(kind: string, inputs: KeyInputs): string {
  return sha256(JSON.stringify({ kind, inputs: inputHashes(inputs) }));
}

/** Directory names use a prefix of the key; the manifest keeps all of it. */
export function artifactDir(root: string, kind: string, key: string): string {
  return join(root, kind, key.slice(0, 24));
}

function validRecord(r: unknown): r is FileRecord {
  const f = r as FileRecord | null | undefined;
  return (
    typeof f === 'object' &&
    f !== null &&
    Number.isSafeInteger(f.size) &&
    typeof f.mtimeMs === 'number' &&
    typeof f.sha256 === 'string' &&
    typeof f.headHash === 'string'
  );
}

export type CheckResult = { ok: true; manifest: Manifest } | { ok: false; reason: string; exists: boolean };

/**
 * Checks a recorded artifact. Cheap by default: size, mtime and the head hash
 * of each file. The full sha256 runs when asked (verify), or when a file's
 * mtime no longer matches its record (touched or rewritten since the build).
 */
export async function checkArtifact(dir: string, key: string, files: string[], verify = false): Promise<CheckResult> {
  let manifest: Manifest;
  try {
    manifest = JSON.parse(await readFile(join(dir, MANIFEST), 'utf8')) as Manifest;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') return { ok: false, exists: true, reason: 'manifest unreadable' };
    // No manifest: never built, or a directory whose manifest was lost. The
    // second must be moved aside before a rebuild can be renamed into its place.
    const present = await lstat(dir).then(
      () => true,
      () => false,
    );
    return { ok: false, exists: present, reason: present ? 'manifest missing' : 'not built' };
  }
  // The manifest is data on disk like any other: check its shape before trusting a field of it.
  if (
    typeof manifest !== 'object' ||
    manifest === null ||
    manifest.version !== MANIFEST_VERSION ||
    manifest.key !== key ||
    typeof manifest.files !== 'object' ||
    manifest.files === null
  ) {
    return { ok: false, exists: true, reason: 'manifest does not match this artifact' };
  }
  for (const name of files) {
    const record = Object.hasOwn(manifest.files, name) ? manifest.files[name] : undefined;
    if (!validRecord(record)) return { ok: false, exists: true, reason: `${name} not recorded` };
    const path = join(dir, name);
    let st;
    try {
      st = await stat(path);
    } catch {
      return { ok: false, exists: true, reason: `${name} is missing` };
    }
    if (st.size !== record.size) {
      return { ok: false, exists: true, reason: `${name} is ${st.size} bytes, recorded ${record.size}` };
    }
    if ((await headHash(path)) !== record.headHash) {
      return { ok: false, exists: true, reason: `${name}: header/trailer hash differs from the record` };
    }
    // Within a millisecond: tools that restore or copy mtimes (cp -p, tar, utimes) keep no more.
    if (verify || Math.abs(st.mtimeMs - record.mtimeMs) >= 1) {
      if ((await sha256File(path)) !== record.sha256) {
        return { ok: false, exists: true, reason: `${name}: sha256 differs from the record` };
      }
    }
  }
  return { ok: true, manifest };
}

async function recordFile(path: string): Promise<FileRecord> {
  // Read-only from here on: an artifact is immutable once recorded (a VMM opens
  // the image O_RDONLY; this also stops a stray writer that is not root).
  const mode = (await stat(path)).mode & 0o7777;
  await chmod(path, mode & ~0o222);
  await fsyncPath(path);
  const st = await stat(path);
  return { size: st.size, mtimeMs: st.mtimeMs, sha256: await sha256File(path), headHash: await headHash(path) };
}

/** Mount points at or below `dir`. */
async function mountsBelow(dir: string): Promise<string[]> {
  return (await readMounts()).map((m) => m.point).filter((point) => point === dir || point.startsWith(dir + '/'));
}

/**
 * Deletes a build directory, unless something is still mounted inside it: a
 * root-filesystem build killed mid-way (mmdebstrap mounts /proc, /sys and /dev
 * pieces in its chroot) must never lead a recursive delete into the host's.
 */
export async function removeBuildDir(dir: string): Promise<void> {
  const mounts = await mountsBelow(dir);
  if (mounts.length > 0) {
    throw new TorporError(
      'SETUP_FAILED',
      `${dir} still has mounts inside it (${mounts.join(', ')}), left by a build that was killed; ` +
        `unmount them (umount -R ${dir}) and delete the directory`,
    );
  }
  await rm(dir, { recursive: true, force: true });
}

/** Removes temporary build directories left by builders that died (their pid is in the name). */
async function sweepDeadBuilds(kindDir: string): Promise<void> {
  for (const name of await readdir(kindDir).catch(() => [] as string[])) {
    const m = /^\.(?:tmp|damaged)-[0-9a-f]+-(\d+)-/.exec(name);
    // A directory that cannot be removed safely stays (and is reported when it is our own).
    if (m && !processAlive(Number(m[1]))) await removeBuildDir(join(kindDir, name)).catch(() => undefined);
  }
}

/**
 * A file-system error from the store as a typed error saying what to do: a
 * store owned by another user (root built it) or a full disk are the usual ones.
 */
export function storeError(err: unknown, kindDir: string): unknown {
  if (err instanceof TorporError) return err;
  const e = err as NodeJS.ErrnoException;
  if (e.code === 'EACCES' || e.code === 'EPERM' || e.code === 'EROFS') {
    return new TorporError(
      'PERMISSION_DENIED',
      `cannot write to the torpor store at ${kindDir} (${e.message}). Run as the user who owns it (root, if ` +
        '`sudo torpor setup` built it), or set TORPOR_HOME to a directory you own.',
      { cause: err },
    );
  }
  if (e.code === 'ENOSPC' || e.code === 'EDQUOT') {
    return new TorporError('OUT_OF_SPACE', `no space left for the torpor store at ${kindDir}; free some, or set TORPOR_HOME elsewhere`, {
      cause: err,
    });
  }
  return err;
}

/** Returns the artifact for spec, building it (once, across processes) when absent or damaged. */
export async function ensureArtifact(spec: ArtifactSpec, options: ArtifactOptions): Promise<ArtifactResult> {
  try {
    return await ensureArtifactInner(spec, options);
  } catch (err) {
    throw storeError(err, join(options.root, spec.kind));
  }
}

async function ensureArtifactInner(spec: ArtifactSpec, options: ArtifactOptions): Promise<ArtifactResult> {
  const key = artifactKey(spec.kind, spec.inputs);
  const kindDir = join(options.root, spec.kind);
  const dir = artifactDir(options.root, spec.kind, key);

  // Fast path, no lock: a complete artifact is immutable once renamed into place.
  const first = await checkArtifact(dir, key, spec.files, options.verify);
  if (first.ok) return { dir, key, manifest: first.manifest, built: false };

  await mkdir(kindDir, { recursive: true });
  const lock = await acquireLock(join(kindDir, `${key.slice(0, 24)}.lock`), { onWait: options.onWait });
  try {
    // Someone else may have built it while we waited.
    const again = await checkArtifact(dir, key, spec.files, options.verify);
    if (again.ok) return { dir, key, manifest: again.manifest, built: false };

    await sweepDeadBuilds(kindDir);
    const tag = `${key.slice(0, 12)}-${process.pid}-${randomHex(4)}`;
    if (again.exists) {
      options.onDamaged?.(dir, again.reason);
      // Move it aside first: the rename is atomic, so no reader sees a half-deleted artifact.
      const aside = join(kindDir, `.damaged-${tag}`);
      await rename(dir, aside);
      await removeBuildDir(aside);
    }

    const tmp = join(kindDir, `.tmp-${tag}`);
    await mkdir(tmp);
    const started = Date.now();
    try {
      await spec.build(tmp);
      const files: Record<string, FileRecord> = {};
      for (const name of spec.files) {
        try {
          files[name] = await recordFile(join(tmp, name));
        } catch (err) {
          throw new TorporError('SETUP_FAILED', `building ${spec.kind} did not produce ${name}`, { cause: err });
        }
      }
      const manifest: Manifest = {
        version: MANIFEST_VERSION,
        kind: spec.kind,
        key,
        inputs: inputHashes(spec.inputs),
        files,
        createdAt: new Date().toISOString(),
        buildMs: Date.now() - started,
      };
      await writeFile(join(tmp, MANIFEST), JSON.stringify(manifest, null, 2) + '\n');
      await fsyncPath(join(tmp, MANIFEST));
      await fsyncPath(tmp);
      await rename(tmp, dir);
      await fsyncPath(kindDir);
      return { dir, key, manifest, built: true };
    } catch (err) {
      await removeBuildDir(tmp).catch(() => undefined);
      throw err;
    }
  } finally {
    await lock.release();
  }
}
