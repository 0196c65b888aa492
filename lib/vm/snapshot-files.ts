// The files of a machine's snapshot directory as the addon writes them (docs/snapshot.md):
// gen-<n>/{vm.state, mem.layer, disk<i>.overlay(.map), manifest.json}, `current`, layers/ (merged
// memory layers and disk overlays) and tops/ (live disk tops). Each generation's manifest.json
// names its memory chain and each disk's frozen layers; older generations' files that the current
// one no longer names (merged away) can go.
import { readFileSync } from 'node:fs';
import { readdir, readFile, rmdir, unlink } from 'node:fs/promises';
import { isAbsolute, join } from 'node:path';

export interface GenerationManifest {
  generation: number;
  /** The memory chain, bottom first: relative to the directory, or absolute. */
  layers: string[];
  /** Per disk, its frozen layers, oldest first (absent in manifests written before they said). */
  disks?: string[][];
}

function isPathList(v: unknown): v is string[] {
  return Array.isArray(v) && v.every((p) => typeof p === 'string' && p.length > 0 && !p.includes('\0'));
}

/** gen-<n>/manifest.json of `dir`, or null when missing or not what the addon writes. */
export function readManifest(dir: string, generation: number): GenerationManifest | null {
  try {
    const m = JSON.parse(readFileSync(join(dir, `gen-${generation}`, 'manifest.json'), 'utf8')) as Record<string, unknown>;
    if (m.generation !== generation || !isPathList(m.layers)) return null;
    if (m.disks !== undefined && !(Array.isArray(m.disks) && m.disks.every(isPathList))) return null;
    return { generation, layers: m.layers, ...(m.disks ? { disks: m.disks as string[][] } : {}) };
  } catch {
    return null;
  }
}

/** The generation `current` names in `dir`; 0 when none. */
export async function currentGenerationOf(dir: string): Promise<number> {
  const text = await readFile(join(dir, 'current'), 'utf8').catch(() => '');
  const m = /^gen-(\d{1,18})\n?$/.exec(text);
  return m ? Number(m[1]) : 0;
}

/**
 * Removes the files of older generations (gen-<k>/ below the current one), of layers/ and of
 * tops/ that the current generation's manifest does not name, nor `keep` (absolute paths; a disk
 * layer's .map goes with it). The current generation's directory, newer ones (a capture that
 * died before switching `current`) and any *.tmp are left alone. Does nothing when the current
 * manifest cannot be read: a file kept is never a loss. Only while no machine captures into or
 * merges in `dir`. Returns how many files it removed.
 */
export async function pruneSnapshotDir(dir: string, keep: readonly string[] = []): Promise<number> {
  const generation = await currentGenerationOf(dir);
  const current = generation ? readManifest(dir, generation) : null;
  if (!current) return 0;
  const named = new Set<string>();
  const name = (p: string) => {
    const abs = isAbsolute(p) ? p : join(dir, p);
    named.add(abs);
    named.add(`${abs}.map`);
  };
  current.layers.forEach(name);
  current.disks?.flat().forEach(name);
  keep.forEach(name);
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
    const m = /^gen-(\d{1,18})$/.exec(entry);
    if (m && Number(m[1]) < generation) await sweep(entry, true);
  }
  await sweep('layers', false);
  // Disk tops: a generation names its frozen copy (a hard link under gen-<n>/), never the top's
  // own name, and with no machine running none of them is live.
  await sweep('tops', false);
  return removed;
}
