// Host tools each setup phase needs, and the Debian packages that provide them,
// so a missing tool produces one message naming everything to install.
import { accessSync, constants, existsSync } from 'node:fs';
import { delimiter, join } from 'node:path';

import { TorporError } from '../errors.js';
import type { PhaseName } from './progress.js';

interface Requirement {
  /** A command looked up on PATH, or an absolute path that must exist. */
  need: string;
  pkg: string;
}

export const LINUX_SOURCE_TARBALL = '/usr/src/linux-source-6.1.tar.xz';

/** A setup phase; 'image': the base root filesystem made from a container image (no root, no
 *  build); 'rootfs-user': the Debian base built without root (mmdebstrap's unshare mode). */
export type ToolSet = PhaseName | 'image' | 'rootfs-user';

/** mke2fs -d rootfs.tar (>= 1.47.1, lib/image/ext4.ts checks the version), debugfs for the
 *  agent and xattrs; mke2fs reads the tarball through libarchive, loaded at run time. */
const imagePipeline: Requirement[] = [
  { need: 'mke2fs', pkg: 'e2fsprogs' },
  { need: 'debugfs', pkg: 'e2fsprogs' },
  { need: '/usr/lib/x86_64-linux-gnu/libarchive.so.13', pkg: 'libarchive13' },
];

const requirements: Record<ToolSet, Requirement[]> = {
  agent: [
    { need: 'make', pkg: 'make' },
    { need: 'cc', pkg: 'gcc' },
    // guest/image/add-agent.sh writes the agent into the image with debugfs.
    { need: 'debugfs', pkg: 'e2fsprogs' },
  ],
  kernel: [
    { need: 'make', pkg: 'make' },
    { need: 'gcc', pkg: 'gcc' },
    { need: 'flex', pkg: 'flex' },
    { need: 'bison', pkg: 'bison' },
    { need: 'bc', pkg: 'bc' },
    { need: 'perl', pkg: 'perl' },
    { need: 'xz', pkg: 'xz-utils' },
    { need: '/usr/include/libelf.h', pkg: 'libelf-dev' },
    { need: LINUX_SOURCE_TARBALL, pkg: 'linux-source-6.1' },
  ],
  rootfs: [
    { need: 'mmdebstrap', pkg: 'mmdebstrap' },
    { need: 'mkfs.ext4', pkg: 'e2fsprogs' },
    // guest/image/build.sh detaches whatever a failed mmdebstrap left mounted before deleting its tree.
    { need: 'umount', pkg: 'mount' },
  ],
  // The tree from mmdebstrap's unshare mode becomes ext4 through the image pipeline.
  'rootfs-user': [{ need: 'mmdebstrap', pkg: 'mmdebstrap' }, { need: 'newuidmap', pkg: 'uidmap' }, ...imagePipeline],
  image: imagePipeline,
};

/** Whether `command` is an executable on PATH (or in the sbin directories). */
export function onPath(command: string, env: NodeJS.ProcessEnv): boolean {
  // sbin directories too: mkfs.ext4 lives there and non-root PATHs often lack them.
  const dirs = (env.PATH ?? '').split(delimiter).concat(['/usr/sbin', '/sbin']);
  for (const dir of dirs) {
    if (!dir) continue;
    try {
      accessSync(join(dir, command), constants.X_OK);
      return true;
    } catch {
      // keep looking
    }
  }
  return false;
}

/** Every Debian package these tool sets (default: all) check for (each is on deps/debian-packages.txt or -dev.txt). */
export function toolPackages(sets: ToolSet[] = Object.keys(requirements) as ToolSet[]): string[] {
  return [...new Set(sets.flatMap((set) => requirements[set].map((r) => r.pkg)))].sort();
}

/** The Debian packages missing for these phases (empty when all is there). */
export function missingPackages(phases: ToolSet[], env: NodeJS.ProcessEnv = process.env): string[] {
  const missing = new Set<string>();
  for (const phase of phases) {
    for (const { need, pkg } of requirements[phase]) {
      const present = need.startsWith('/') ? existsSync(need) : onPath(need, env);
      if (!present) missing.add(pkg);
    }
  }
  return [...missing].sort();
}

/** One MISSING_TOOLS error naming every package to install for these phases, or null when nothing is missing. */
export function toolsError(phases: ToolSet[], env: NodeJS.ProcessEnv = process.env): TorporError | null {
  const missing = missingPackages(phases, env);
  if (missing.length === 0) return null;
  return new TorporError(
    'MISSING_TOOLS',
    `torpor setup needs host tools that are not installed (for: ${phases.join(', ')}). ` +
      `Install them with: apt-get install ${missing.join(' ')} (or: torpor setup --install-deps)`,
  );
}

/** Throws one MISSING_TOOLS error naming every package to install. */
export function requireTools(phases: ToolSet[], env: NodeJS.ProcessEnv = process.env): void {
  const err = toolsError(phases, env);
  if (err) throw err;
}
