// A machine's snapshot directory as lib reads it. The addon owns its layout (what each file is
// called, native/snapshot/generation_layout.h; docs/snapshot.md): a capture returns the files of
// the generation it wrote, each generation's manifest.json names them (state file, memory chain,
// each disk's frozen layers), and snapshotLayout() says where a generation's manifest is. lib
// never builds a path inside a generation itself. Beside the generations: `current`, layers/
// (merged memory layers and disk overlays) and tops/ (live disk tops); older generations' files
// that the current one no longer names (merged away) can go.
import { readFileSync } from 'node:fs';
import { readdir, readFile, rmdir, unlink } from 'node:fs/promises';
import { isAbsolute, join } from 'node:path';

import { TorporError } from '../errors.js';
import { loadNative } from '../native.js';
import type { NativeGenerationLayout } from '../native-types.js';
import { replaceFileDurably } from './fsync.js';

/** A generation's files as its manifest.json names them. Paths are relative to the snapshot
 *  directory (always inside it), or absolute for layers another directory holds (a template's). */
export interface GenerationFiles {
  generation: number;
  /** The manifest itself and the state file (relative). */
  manifest: string;
  state: string;
  /** The memory chain, bottom first; this generation's own layer last. */
  memoryLayers: string[];
  /** Per disk, its frozen layers, oldest first; null when the manifest predates disks (older
   *  addons did not name them). */
  disks: string[][] | null;
}

/** A generation's manifest.json missing, unreadable or not what the addon writes. */
export class SnapshotManifestError extends TorporError {
  constructor(message: string, options?: ErrorOptions) {
    super('SNAPSHOT_INVALID', message, options);
  }
}

const MAX_PATH_BYTES = 4096;
const MAX_LIST = 4096;

/** Where generation `generation` keeps its files (relative to its snapshot directory). */
export function generationLayout(generation: number, disks = 0): NativeGenerationLayout {
  return loadNative().snapshotLayout(generation, disks);
}

/** A path from a manifest: relative without '.', '..' or empty components (so inside the
 *  directory), or, where `absoluteOk`, absolute in the same plain form. */
function checkedPath(where: string, v: unknown, absoluteOk: boolean): string {
  if (typeof v !== 'string' || v.length === 0 || v.includes('\0') || Buffer.byteLength(v) > MAX_PATH_BYTES)
    throw new SnapshotManifestError(`${where}: not a path`);
  const absolute = v.startsWith('/');
  if (absolute && !absoluteOk) throw new SnapshotManifestError(`${where}: '${v}' is not inside the snapshot directory`);
  const parts = (absolute ? v.slice(1) : v).split('/');
  if (parts.some((c) => c === '' || c === '.' || c === '..'))
    throw new SnapshotManifestError(`${where}: '${v}' is not a plain path${absolute ? '' : ' inside the snapshot directory'}`);
  return v;
}

/** A path relative to a snapshot directory that stays inside it (plain: no '.', '..' or empty
 *  components, no NUL): what a capture and a manifest name the directory's own files with. */
export function isPlainRelativePath(p: unknown): p is string {
  try {
    checkedPath('', p, false);
    return true;
  } catch {
    return false;
  }
}

function checkedList(where: string, v: unknown): string[] {
  if (!Array.isArray(v) || v.length > MAX_LIST) throw new SnapshotManifestError(`${where}: not a list of paths`);
  return v.map((p, i) => checkedPath(`${where}[${i}]`, p, true));
}

/**
 * The files of generation `generation` in snapshot directory `dir`, read from its manifest.json
 * and checked (the manifest is data on disk: its shape, and that its own files stay inside
 * `dir`). Manifests of older addons, without `disks` or `state`, are read too. Throws
 * SnapshotManifestError (SNAPSHOT_INVALID) when the manifest is missing or malformed.
 */
export function readGenerationFiles(dir: string, generation: number): GenerationFiles {
  if (!Number.isSafeInteger(generation) || generation < 1)
    throw new SnapshotManifestError(`generation ${String(generation)} is not a generation number`);
  const layout = generationLayout(generation);
  const where = join(dir, layout.manifest);
  let m: unknown;
  try {
    m = JSON.parse(readFileSync(where, 'utf8'));
  } catch (err) {
    throw new SnapshotManifestError(`${where}: ${(err as Error).message}`, { cause: err });
  }
  if (typeof m !== 'object' || m === null || Array.isArray(m)) throw new SnapshotManifestError(`${where}: not an object`);
  const o = m as Record<string, unknown>;
  if (o.generation !== generation) throw new SnapshotManifestError(`${where}: names generation ${String(o.generation)}`);
  const memoryLayers = checkedList(`${where} layers`, o.layers);
  if (memoryLayers.length === 0) throw new SnapshotManifestError(`${where}: no memory layers`);
  let disks: string[][] | null = null;
  if (o.disks !== undefined) {
    if (!Array.isArray(o.disks) || o.disks.length > MAX_LIST) throw new SnapshotManifestError(`${where} disks: not a list`);
    disks = o.disks.map((d, i) => checkedList(`${where} disks[${i}]`, d));
  }
  const state = o.state === undefined ? layout.state : checkedPath(`${where} state`, o.state, false);
  return { generation, manifest: layout.manifest, state, memoryLayers, disks };
}

/** readGenerationFiles, or null when the manifest is missing or malformed (the callers that
 *  then fall back to what they recorded themselves). */
export function readGenerationFilesOrNull(dir: string, generation: number): GenerationFiles | null {
  try {
    return readGenerationFiles(dir, generation);
  } catch (err) {
    if (err instanceof SnapshotManifestError) return null;
    throw err;
  }
}

/** The generation a generation directory's name (or `current`'s text) says; 0 for any other name. */
function generationNamed(name: string): number {
  const m = /(\d{1,15})$/.exec(name);
  const n = m ? Number(m[1]) : 0;
  return n > 0 && generationLayout(n).dir === name ? n : 0;
}

/** The generation `current` names in `dir`; 0 when none. */
export async function currentGenerationOf(dir: string): Promise<number> {
  const text = await readFile(join(dir, 'current'), 'utf8').catch(() => '');
  return generationNamed(text.endsWith('\n') ? text.slice(0, -1) : text);
}

/** Points `snapshots`/current at `generation` (a temporary file renamed over it, then the
 *  directory synced): the generation a restore of that directory loads. */
export async function writeCurrent(snapshots: string, generation: number): Promise<void> {
  const current = join(snapshots, 'current');
  await replaceFileDurably(current, `${generationLayout(generation).dir}\n`);
}

/**
 * Removes the files of older generations (their directories below the current one), of layers/ and of
 * tops/ that the current generation's manifest does not name, nor `keep` (absolute paths; a disk
 * layer's .map goes with it), nor a generation in `keepGenerations` (checkpoints: their directories
 * and the layers they name stay). The current generation's directory, newer ones (a capture that
 * died before switching `current`) and any *.tmp are left alone. Does nothing when the current
 * manifest cannot be read: a file kept is never a loss. Only while no machine captures into or
 * merges in `dir`. Returns how many files it removed.
 */
export async function pruneSnapshotDir(dir: string, keep: readonly string[] = [], keepGenerations: readonly number[] = []): Promise<number> {
  const generation = await currentGenerationOf(dir);
  const current = generation ? readGenerationFilesOrNull(dir, generation) : null;
  if (!current) return 0;
  const named = new Set<string>();
  const name = (p: string) => {
    const abs = isAbsolute(p) ? p : join(dir, p);
    named.add(abs);
    named.add(`${abs}.map`);
  };
  current.memoryLayers.forEach(name);
  current.disks?.flat().forEach(name);
  keep.forEach(name);
  // A kept generation (a checkpoint) keeps its directory and every layer its manifest names; one
  // whose manifest cannot be read keeps its directory (a file kept is never a loss).
  const keptDirs = new Set<number>();
  for (const g of keepGenerations) {
    if (g >= generation) continue;
    keptDirs.add(g);
    const files = readGenerationFilesOrNull(dir, g);
    files?.memoryLayers.forEach(name);
    files?.disks?.flat().forEach(name);
  }
  let removed = 0;
  const sweep = async (sub: string, removeDir: boolean) => {
    const names = await readdir(join(dir, sub)).catch(() => null);
    if (!names) return;
    let left = names.length;
    for (const n of names) {
      const p = join(dir, sub, n);
      if (n.endsWith('.tmp') || named.has(p)) continue;
      if (await unlink(p).then(() => true, () => false)) {
        removed++;
        left--;
      }
    }
    if (removeDir && left === 0) await rmdir(join(dir, sub)).catch(() => undefined);
  };
  for (const entry of await readdir(dir).catch(() => [] as string[])) {
    const g = generationNamed(entry);
    if (g > 0 && g < generation && !keptDirs.has(g)) await sweep(entry, true);
  }
  await sweep('layers', false);
  // Disk tops: a generation names its frozen copy (a hard link in its directory), never the top's
  // own name, and with no machine running none of them is live.
  await sweep('tops', false);
  return removed;
}
