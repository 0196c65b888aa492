// The prebuilt guest: a per-platform npm package (`@torpor/kernel-linux-x64`, made by
// `npm run build:kernel-package` from packages/kernel-linux-x64/) holding the guest kernel and
// the static guest agent, so a user needs no compiler, no linux-source and no root. torpor
// lists it in optionalDependencies, as sharp and esbuild ship their binaries.
//
// Trust: the package is only a carrier. What torpor boots is decided by the release record
// (kernel-release.json at torpor's package root), written by the same script that made the
// package: the sha256 of each file. A package whose bytes differ is refused
// (KERNEL_PACKAGE_MISMATCH) and never stored or booted; a torpor without a record (a
// checkout) does not use a package at all and builds from source as before.
import { existsSync, readFileSync } from 'node:fs';
import { copyFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

import { TorporError } from '../errors.js';
import { ensureArtifact } from '../store/artifact.js';
import { sha256File } from '../store/hash.js';
import type { PrebuiltAgent } from './agent.js';
import { inspectKernel } from './kernel-format.js';
import type { KernelArtifact } from './kernel.js';
import { packageRoot } from './paths.js';

/** The package for this host's platform: `@torpor/kernel-linux-x64` on x86-64 Linux. */
export function kernelPackageName(platform: string = process.platform, arch: string = process.arch): string {
  return `@torpor/kernel-${platform}-${arch}`;
}

/** Where torpor keeps the record of the package it was released with. */
export const RELEASE_RECORD = 'kernel-release.json';

/** The files of the package, and what each holds. */
export const PACKAGE_FILES = { kernel: 'vmlinux', agent: 'torpor-agent' } as const;

/** What `npm run build:kernel-package` records, in the package (manifest.json) and in torpor (kernel-release.json). */
export interface KernelRelease {
  package: string;
  version: string;
  kernel: { file: string; sha256: string; size: number; linux: string };
  agent: { file: string; sha256: string; size: number };
}

const HEX64 = /^[0-9a-f]{64}$/;

/** A release record's JSON; not JSON is INTERNAL (records ship with torpor, a user never writes them). */
export function readReleaseJson<T>(text: string, what: string): T {
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    throw new TorporError('INTERNAL', `${what} is not JSON: ${(err as Error).message}`);
  }
}

/** Parses a record; anything malformed is INTERNAL (it ships with torpor, a user never writes it). */
export function parseRelease(text: string, what: string): KernelRelease {
  const r = readReleaseJson<KernelRelease>(text, what);
  const ok =
    typeof r?.package === 'string' &&
    typeof r.version === 'string' &&
    typeof r.kernel?.sha256 === 'string' &&
    HEX64.test(r.kernel.sha256) &&
    r.kernel.file === PACKAGE_FILES.kernel &&
    typeof r.agent?.sha256 === 'string' &&
    HEX64.test(r.agent.sha256) &&
    r.agent.file === PACKAGE_FILES.agent;
  if (!ok) throw new TorporError('INTERNAL', `${what} is not a kernel release record`);
  return r;
}

/** torpor's own record, or undefined where it has none (a checkout: nothing was released). */
export function releaseRecord(root: string = packageRoot): KernelRelease | undefined {
  const path = join(root, RELEASE_RECORD);
  if (!existsSync(path)) return undefined;
  return parseRelease(readFileSync(path, 'utf8'), path);
}

/** The installed package's directory, found as Node resolves torpor's own dependencies; undefined when not installed. */
export function findKernelPackage(name: string = kernelPackageName(), from: string = packageRoot): string | undefined {
  try {
    return dirname(createRequire(join(from, 'package.json')).resolve(`${name}/package.json`));
  } catch {
    return undefined;
  }
}

/** The prebuilt guest torpor will use, when it has a record and the package is installed. */
export interface KernelPackage {
  dir: string;
  release: KernelRelease;
}

/** Which prebuilt package applies here, or why none does (for doctor and setup). */
export function kernelPackage(root: string = packageRoot): { found: KernelPackage } | { missing: string } {
  const release = releaseRecord(root);
  const name = release?.package ?? kernelPackageName();
  if (!release) return { missing: `this torpor has no ${RELEASE_RECORD} (a checkout, not a release)` };
  const dir = findKernelPackage(name, root);
  if (!dir) return { missing: `${name} is not installed (npm skips it on another platform, or with --omit=optional)` };
  return { found: { dir, release } };
}

function mismatch(pkg: KernelPackage, file: string, got: string, want: string): TorporError {
  return new TorporError(
    'KERNEL_PACKAGE_MISMATCH',
    `${join(pkg.dir, file)} has sha256 ${got}, but torpor ${pkg.release.version} was released with ${want} ` +
      `(${pkg.release.package}@${pkg.release.version}): not booted. Reinstall torpor and its ${pkg.release.package} ` +
      'from the same release, or build the kernel from source with TORPOR_KERNEL_PACKAGE=0.',
  );
}

/**
 * The package's kernel, copied into the store keyed by the recorded hash. The copy is hashed
 * and inspected before it is kept: a package whose kernel differs from the record is refused
 * and nothing is stored. Later calls find the stored copy and read nothing from the package.
 */
export async function packagedKernel(pkg: KernelPackage, root: string, verify: boolean): Promise<KernelArtifact> {
  const want = pkg.release.kernel.sha256;
  const artifact = await ensureArtifact(
    {
      kind: 'kernel-package',
      inputs: { sha256: want },
      files: [PACKAGE_FILES.kernel],
      build: async (dir) => {
        const dest = join(dir, PACKAGE_FILES.kernel);
        await copyFile(join(pkg.dir, PACKAGE_FILES.kernel), dest);
        const got = await sha256File(dest);
        if (got !== want) throw mismatch(pkg, PACKAGE_FILES.kernel, got, want);
        const info = await inspectKernel(dest);
        if (info.format !== 'elf-pvh') throw new TorporError('KERNEL_INVALID', `${join(pkg.dir, PACKAGE_FILES.kernel)} has no PVH note (${info.format})`);
      },
    },
    { root, verify },
  );
  const size = artifact.manifest.files[PACKAGE_FILES.kernel]!.size;
  return { path: join(artifact.dir, PACKAGE_FILES.kernel), info: { format: 'elf-pvh', size }, origin: 'package', sha256: want, artifact };
}

/** The package's agent, to be stored only if its bytes are the ones the record names (the agent phase hashes the copy). */
export function packagedAgent(pkg: KernelPackage): PrebuiltAgent {
  const want = pkg.release.agent.sha256;
  return { path: join(pkg.dir, PACKAGE_FILES.agent), expect: { sha256: want, refuse: (got) => mismatch(pkg, PACKAGE_FILES.agent, got, want) } };
}
