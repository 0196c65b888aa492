// What a sandbox's generations name, read from their manifest.json, and the files under
// snapshots/ that the last generation no longer needs.
//
// The addon merges a machine's own layers off the capture path (native/vmm/machine_merge.cc):
// a generation's disk is a short chain (template layers, a merged overlay, the few frozen
// since), and its memory chain a merged full layer and the diffs after it. Each manifest.json
// names both. Without a sweep, every older generation's files would stay on disk forever.
import { readFileSync } from 'node:fs';
import { readdir, rmdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';

import type { SandboxDir } from './sandbox-dir.js';

interface Manifest {
  layers: string[];
  disks?: string[][];
}

function isStringArray(v: unknown): v is string[] {
  return Array.isArray(v) && v.every((p) => typeof p === 'string' && p.length > 0 && !p.includes('\0'));
}

/** gen-<n>/manifest.json, or null when missing or not what the addon writes. */
function readManifest(dir: SandboxDir, generation: number): Manifest | null {
  try {
    const m = JSON.parse(readFileSync(join(dir.snapshots, `gen-${generation}`, 'manifest.json'), 'utf8')) as Record<string, unknown>;
    if (!isStringArray(m.layers)) return null;
    if (m.disks !== undefined && !(Array.isArray(m.disks) && m.disks.every(isStringArray))) return null;
    return { layers: m.layers, ...(m.disks ? { disks: m.disks as string[][] } : {}) };
  } catch {
    return null;
  }
}

/** A layer path as a generation's state names it (relative to snapshots/, or absolute), as
 *  meta.json records it (relative to the sandbox directory, or absolute: a template's). */
export function metaLayerPath(dir: SandboxDir, p: string): string {
  return p.startsWith('/') ? dir.metaPathOf(p) : `snapshots/${p}`;
}

/** The disk layers generation `generation` froze, as meta.json records them; null when its
 *  manifest does not say (written before manifests named disks, or damaged). */
export function generationDiskLayers(dir: SandboxDir, generation: number): string[] | null {
  const disk = readManifest(dir, generation)?.disks?.[0];
  return disk ? disk.map((p) => metaLayerPath(dir, p)) : null;
}

/**
 * After a pause whose meta.json is durable: removes every file under snapshots/gen-<k>/ (k below
 * the current generation) and snapshots/layers/ that neither the current generation's memory
 * chain nor `diskLayers` (meta.json's, the disk a boot from disk would stack) names. The current
 * generation's own directory and anything newer are left alone. Does nothing when the current
 * manifest cannot be read: a file kept is never a loss. Returns the files removed.
 */
export async function dropUnreferencedLayers(dir: SandboxDir, generation: number, diskLayers: readonly string[]): Promise<number> {
  const current = readManifest(dir, generation);
  if (!current) return 0;
  const keep = new Set<string>();
  const name = (p: string) => {
    const meta = metaLayerPath(dir, p); // relative to the sandbox directory
    keep.add(meta);
    keep.add(`${meta}.map`);
  };
  current.layers.forEach(name);
  current.disks?.flat().forEach(name);
  for (const p of diskLayers) {
    keep.add(p);
    keep.add(`${p}.map`);
  }
  let removed = 0;
  const sweep = async (sub: string, removeDir: boolean) => {
    const names = await readdir(join(dir.snapshots, sub)).catch(() => null);
    if (!names) return;
    let left = names.length;
    for (const n of names) {
      // A merge still writing (.tmp) is not ours to judge.
      if (n.endsWith('.tmp') || keep.has(`snapshots/${sub}/${n}`)) continue;
      if (await unlink(join(dir.snapshots, sub, n)).then(() => true, () => false)) {
        removed++;
        left--;
      }
    }
    if (removeDir && left === 0) await rmdir(join(dir.snapshots, sub)).catch(() => undefined);
  };
  for (const entry of await readdir(dir.snapshots).catch(() => [] as string[])) {
    const m = /^gen-(\d{1,18})$/.exec(entry);
    if (m && Number(m[1]) < generation) await sweep(entry, true);
  }
  await sweep('layers', false);
  return removed;
}
