// A sandbox's generations as meta.json sees them: the disk layers a generation names, in
// meta.json's form, and the sweep after a pause (lib/store/snapshot-files.ts does the reading).
// Takes the directory's paths, not a SandboxDir: sandbox-dir.ts builds on this module.
import { join } from 'node:path';

import { generationLayout, pruneSnapshotDir, readGenerationFilesOrNull } from './snapshot-files.js';

/** Where a sandbox directory keeps its generations: its path and its snapshots/ in it. */
export interface GenerationsDir {
  readonly path: string;
  readonly snapshots: string;
}

/** A layer path as a generation's state names it (relative to snapshots/, or absolute), as
 *  meta.json records it (relative to the sandbox directory, or absolute: a template's). */
export function metaLayerPath(dir: GenerationsDir, p: string): string {
  return p.startsWith('/') ? metaPathIn(dir.path, p) : `snapshots/${p}`;
}

/** An absolute path as meta.json records it: relative when inside `root`, else as it is. */
export function metaPathIn(root: string, p: string): string {
  return p.startsWith(root + '/') ? p.slice(root.length + 1) : p;
}

/** The disk layers generation `generation` froze, as meta.json records them; null when its
 *  manifest does not say (written before manifests named disks, or damaged). */
export function generationDiskLayers(dir: GenerationsDir, generation: number): string[] | null {
  const disk = readGenerationFilesOrNull(dir.snapshots, generation)?.disks?.[0];
  return disk ? disk.map((p) => metaLayerPath(dir, p)) : null;
}

/** The top of disk 0 that generation `generation` froze, as meta.json records it, for a
 *  generation whose manifest does not name its disks (the addon's layout says where it is). */
export function frozenDiskTop(generation: number): string {
  return `snapshots/${generationLayout(generation, 1).diskOverlays[0]!}`;
}

/** After a pause whose meta.json is durable: the files of older generations that neither the
 *  last generation nor meta.json's disk layers name go (merged away). Returns how many. */
export function dropUnreferencedLayers(dir: GenerationsDir, diskLayers: readonly string[], keepGenerations: readonly number[] = []): Promise<number> {
  return pruneSnapshotDir(
    dir.snapshots,
    diskLayers.map((p) => (p.startsWith('/') ? p : join(dir.path, p))),
    keepGenerations,
  );
}
