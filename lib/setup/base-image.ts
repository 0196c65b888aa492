// The base root filesystem from a container image (TORPOR_BASE_IMAGE, or `baseImage` given to
// setup): pulled through lib/image (the OCI distribution API, blobs checked and cached,
// resumable), flattened, written with `mke2fs -d` and the agent injected, exactly as a template
// from an image is. No root, no mmdebstrap, no Debian mirror: what a user without root needs.
//
// Stored as artifacts/rootfs-image/<key>/, keyed by the reference as given and the agent's hash,
// so a later setup or Sandbox.create finds it without asking the registry again. Pin the
// reference by digest (`name@sha256:...`): a tag is resolved once, when the image is first made.
import { existsSync, readFileSync } from 'node:fs';
import { copyFile, link, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { fetchImage } from '../image/index.js';
import { parseImageReference } from '../image/reference.js';
import { imageRootfs, ROOTFS_FORMAT } from '../image/rootfs.js';
import type { ImageProgress } from '../image/types.js';
import { artifactDir, artifactKey, checkArtifact, ensureArtifact } from '../store/artifact.js';
import { readReleaseJson } from './kernel-package.js';
import { packageRoot } from './paths.js';
import type { ProgressSink } from './progress.js';

export const IMAGE_BASE_FILES = ['rootfs.ext4', 'image.json'];

/** torpor's default base image, as a release names it (written by scripts/build-base-image.ts). */
export const BASE_RECORD = 'base-image.json';

/** What the record holds: the image by digest, and its one layer (for doctor's download size). */
export interface BaseRelease {
  reference: string;
  tag: string;
  layer: { digest: string; size: number; tarBytes: number };
  packages: number;
}

/** Parses a record; anything malformed is INTERNAL (it ships with torpor, a user never writes it). */
export function parseBaseRelease(text: string, what: string): BaseRelease {
  const r = readReleaseJson<BaseRelease>(text, what);
  const pinned = typeof r?.reference === 'string' && /@sha256:[0-9a-f]{64}$/.test(r.reference);
  if (!pinned || typeof r.layer?.size !== 'number' || typeof r.layer.tarBytes !== 'number') {
    throw new TorporError('INTERNAL', `${what} is not a base image record (a reference pinned by digest, and its layer)`);
  }
  parseImageReference(r.reference);
  return r;
}

/** The base image this torpor release names, or undefined (a checkout: the base is built from Debian). */
export function baseRelease(root: string = packageRoot): BaseRelease | undefined {
  const path = join(root, BASE_RECORD);
  if (!existsSync(path)) return undefined;
  return parseBaseRelease(readFileSync(path, 'utf8'), path);
}

/** The base image asked for: the option, then TORPOR_BASE_IMAGE; undefined when neither is given. */
export function baseImageRef(option?: string, env: NodeJS.ProcessEnv = process.env): string | undefined {
  const ref = option ?? env.TORPOR_BASE_IMAGE;
  if (ref === undefined || ref === '') return undefined;
  try {
    parseImageReference(ref);
  } catch (err) {
    throw new TorporError('INVALID_ARGUMENT', `base image ${JSON.stringify(ref)} (TORPOR_BASE_IMAGE): ${(err as Error).message}`, { cause: err });
  }
  return ref;
}

function imageBaseInputs(ref: string, agentSha256: string): Record<string, string> {
  return { image: ref, agent: agentSha256, format: String(ROOTFS_FORMAT) };
}

/** True when the root filesystem from this image and agent is stored (nothing to fetch). */
export async function imageBaseIsCached(root: string, ref: string, agentSha256: string, verify: boolean): Promise<boolean> {
  const inputs = imageBaseInputs(ref, agentSha256);
  const key = artifactKey('rootfs-image', inputs);
  return (await checkArtifact(artifactDir(root, 'rootfs-image', key), key, IMAGE_BASE_FILES, verify)).ok;
}

/** Setup's progress lines for the image pipeline's events: bytes and rate while downloading. */
function imageProgress(onProgress: ProgressSink | undefined, started: number): (p: ImageProgress) => void {
  return (p) => {
    const elapsedMs = Date.now() - started;
    if (p.phase === 'download') {
      const rate = elapsedMs > 0 ? ((p.bytes / (1 << 20)) * 1000) / elapsedMs : 0;
      const percent = p.total > 0 ? (p.bytes * 100) / p.total : undefined;
      onProgress?.({
        phase: 'rootfs',
        status: 'step',
        bytes: p.bytes,
        ...(percent !== undefined ? { percent } : {}),
        message: `${p.cached ? 'cached' : 'download'} ${p.digest.slice(7, 19)} of ${(p.total / (1 << 20)).toFixed(1)} MiB at ${rate.toFixed(1)} MiB/s`,
        elapsedMs,
      });
    } else {
      onProgress?.({ phase: 'rootfs', status: 'step', ...(p.phase === 'unpack' && p.bytes !== undefined ? { bytes: p.bytes } : {}), message: `${p.phase}: ${p.message}`, elapsedMs });
    }
  };
}

/** The base root filesystem made from `ref`, with the agent in it. */
export async function ensureImageBase(
  home: string,
  root: string,
  ref: string,
  agent: { path: string; sha256: string },
  verify: boolean,
  onProgress?: ProgressSink,
): Promise<{ path: string; artifact: Awaited<ReturnType<typeof ensureArtifact>> }> {
  const started = Date.now();
  const artifact = await ensureArtifact(
    {
      kind: 'rootfs-image',
      inputs: imageBaseInputs(ref, agent.sha256),
      files: IMAGE_BASE_FILES,
      build: async (dir) => {
        onProgress?.({ phase: 'rootfs', status: 'start', message: `base image ${ref}`, elapsedMs: 0 });
        const progress = imageProgress(onProgress, started);
        const image = await fetchImage({ image: ref }, { home, onProgress: progress });
        const made = await imageRootfs(image, { home, agent, onProgress: progress });
        // The image's own copy stays where templates from the same image find it; a hard link
        // costs nothing (both live under TORPOR_HOME), a copy where links are not allowed.
        const dest = join(dir, 'rootfs.ext4');
        await link(made.path, dest).catch(() => copyFile(made.path, dest));
        await writeFile(
          join(dir, 'image.json'),
          JSON.stringify({ reference: ref, manifestDigest: image.manifestDigest, configDigest: image.configDigest, sizeMiB: made.sizeMiB, contentBytes: made.contentBytes }, null, 2) + '\n',
        );
      },
    },
    {
      root,
      verify,
      onWait: (pid) => onProgress?.({ phase: 'rootfs', status: 'note', message: `waiting for another setup of the base image (pid ${pid ?? '?'})`, elapsedMs: 0 }),
      onDamaged: (_dir, reason) => onProgress?.({ phase: 'rootfs', status: 'note', message: `stored base image is damaged (${reason}); making it again`, elapsedMs: 0 }),
    },
  );
  return { path: join(artifact.dir, 'rootfs.ext4'), artifact };
}
