// One entry point for every image source a template can be built from.
import { fromDockerArchive } from './docker-archive.js';
import { fromOciLayout, type LocalImageOptions } from './oci-layout.js';
import { pullImage, type PullOptions } from './registry.js';
import type { PulledImage } from './types.js';

export type ImageSource = { image: string } | { ociLayout: string; tag?: string } | { dockerArchive: string; tag?: string };

export type FetchOptions = PullOptions;

/** The image `from` names, its config parsed and its layers verified in the blob store. */
export function fetchImage(from: ImageSource, opts: FetchOptions = {}): Promise<PulledImage> {
  const local: LocalImageOptions = {};
  if (opts.home !== undefined) local.home = opts.home;
  if (opts.onProgress !== undefined) local.onProgress = opts.onProgress;
  if ('image' in from) return pullImage(from.image, opts);
  if ('ociLayout' in from) return fromOciLayout(from.ociLayout, from.tag === undefined ? local : { ...local, tag: from.tag });
  return fromDockerArchive(from.dockerArchive, from.tag === undefined ? local : { ...local, tag: from.tag });
}

export { parseImageReference, type ImageReference } from './reference.js';
export { parseImageConfig } from './config.js';
export { pullImage, type PullOptions } from './registry.js';
export { fromOciLayout, type LocalImageOptions } from './oci-layout.js';
export { fromDockerArchive } from './docker-archive.js';
export { BlobStore, blobDir } from './blob-store.js';
export { loadCredentials, type RegistryCredentials } from './auth.js';
export type { PulledImage, ImageLayer, ImageConfig, ImageProgress } from './types.js';
