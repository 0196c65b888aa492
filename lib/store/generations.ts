// A sandbox's generations as meta.json sees them: the disk layers a generation names, in
// meta.json's form, and the sweep after a pause (lib/vm/snapshot-files.ts does the reading).
import { join } from 'node:path';

import { pruneSnapshotDir, readManifest } from '../vm/snapshot-files.js';
import type { SandboxDir } from './sandbox-dir.js';

/** A layer path as a generation's state names it (relative to snapshots/, or absolute), as
 *  meta.json records it (relative to the sandbox directory, or absolute: a template's). */
export function metaLayerPath(dir: SandboxDir, p: string): string {
  return p.startsWith('/') ? dir.metaPathOf(p) : `snapshots/${p}`;
}

/** The disk layers generation `generation` froze, as meta.json records them; null when its
 *  manifest does not say (written before manifests named disks, or damaged). */
export function generationDiskLayers(dir: SandboxDir, generation: number): string[] | null {
  const disk = readManifest(dir.snapshots, generation)?.disks?.[0];
  return disk ? disk.map((p) => metaLayerPath(dir, p)) : null;
}

/** After a pause whose meta.json is durable: the files of older generations that neither the
 *  last generation nor meta.json's disk layers name go (merged away). Returns how many. */
export function dropUnreferencedLayers(dir: SandboxDir, diskLayers: readonly string[]): Promise<number> {
  return pruneSnapshotDir(dir.snapshots, diskLayers.map((p) => (p.startsWith('/') ? p : join(dir.path, p))));
}
