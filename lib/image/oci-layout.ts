// An image from an OCI image layout directory (what `skopeo copy ... oci:DIR` or
// `docker buildx --output type=oci` writes): oci-layout, index.json, blobs/sha256/<hex>. Every
// blob is hashed while it is copied into the blob store, so a layout edited or damaged after it
// was written fails here rather than in the guest.
import { createReadStream } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';

import { TorporError } from '../errors.js';
import { torporHome } from '../store/home.js';
import { BlobStore, digestHex } from './blob-store.js';
import { checkPlatform, parseImageConfig } from './config.js';
import { documentKind, INDEX_MEDIA_TYPES, parseIndex, parseJson, parseManifest, selectLinuxAmd64, type Descriptor } from './manifest.js';
import type { ImageLayer, ImageProgress, PulledImage } from './types.js';

export interface LocalImageOptions {
  home?: string;
  onProgress?: (p: ImageProgress) => void;
  /** OCI layouts: the `org.opencontainers.image.ref.name` of the manifest to take, when index.json holds several. */
  tag?: string;
}

const REF_NAME = 'org.opencontainers.image.ref.name';

function invalid(dir: string, why: string, cause?: unknown): TorporError {
  return new TorporError('IMAGE_INVALID', `OCI layout ${dir}: ${why}`, cause === undefined ? {} : { cause });
}

export async function fromOciLayout(dir: string, opts: LocalImageOptions = {}): Promise<PulledImage> {
  const root = resolve(dir);
  const source = `oci-layout:${root}${opts.tag ? `:${opts.tag}` : ''}`;
  const store = new BlobStore(opts.home ?? torporHome());

  const readSmall = async (path: string, what: string): Promise<Buffer> => {
    try {
      return await readFile(path);
    } catch (err) {
      throw invalid(root, `cannot read ${what} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`, err);
    }
  };
  const layoutDoc = parseJson(await readSmall(join(root, 'oci-layout'), 'oci-layout'), `OCI layout ${root}: oci-layout`);
  if (typeof layoutDoc.imageLayoutVersion !== 'string') throw invalid(root, 'oci-layout has no imageLayoutVersion');

  const blobPath = (d: Descriptor) => join(root, 'blobs', 'sha256', digestHex(d.digest));
  /** Copies one blob into the store, checking digest and size on the way. */
  const importBlob = async (d: Descriptor, report: boolean): Promise<string> => {
    if (await store.has(d.digest, d.size)) {
      if (report) opts.onProgress?.({ phase: 'download', digest: d.digest, bytes: d.size, total: d.size, cached: true });
      return store.path(d.digest);
    }
    const path = blobPath(d);
    const st = await stat(path).catch(() => null);
    if (!st?.isFile()) throw invalid(root, `blob ${d.digest} is missing (${path})`);
    const { path: stored } = await store.importStream(createReadStream(path), { digest: d.digest, size: d.size }, source).catch((err) => {
      if (err instanceof TorporError && err.code === 'BLOB_CORRUPT') throw invalid(root, err.message, err);
      throw err;
    });
    if (report) opts.onProgress?.({ phase: 'download', digest: d.digest, bytes: d.size, total: d.size, cached: false });
    return stored;
  };
  /** A small document blob (index, manifest), verified and kept in the store. */
  const readDocument = async (d: Descriptor, what: string) => parseJson(await readFile(await importBlob(d, false)), `OCI layout ${root}: ${what}`);

  const index = parseIndex(parseJson(await readSmall(join(root, 'index.json'), 'index.json'), `OCI layout ${root}: index.json`), `OCI layout ${root}: index.json`);
  let chosen: Descriptor;
  if (opts.tag !== undefined) {
    const named = index.manifests.filter((m) => m.annotations?.[REF_NAME] === opts.tag);
    if (named.length === 0) {
      const names = index.manifests.map((m) => m.annotations?.[REF_NAME]).filter((n) => n !== undefined);
      throw invalid(root, `no manifest named ${JSON.stringify(opts.tag)} in index.json (it names ${names.length ? names.join(', ') : 'none'})`);
    }
    chosen = named.length === 1 ? named[0]! : selectLinuxAmd64({ mediaType: index.mediaType, manifests: named }, `OCI layout ${root}:${opts.tag}`);
  } else if (index.manifests.length === 1) {
    chosen = index.manifests[0]!;
  } else if (index.manifests.length > 1 && index.manifests.every((m) => m.platform)) {
    // index.json itself a multi-platform index (buildx's oci exporter).
    chosen = selectLinuxAmd64(index, `OCI layout ${root}`);
  } else {
    const names = index.manifests.map((m) => m.annotations?.[REF_NAME] ?? m.digest);
    throw invalid(root, `index.json holds ${index.manifests.length} manifests (${names.join(', ') || 'none'}); name one with its tag`);
  }
  let doc = await readDocument(chosen, `manifest ${chosen.digest}`);
  if (INDEX_MEDIA_TYPES.has(chosen.mediaType) || documentKind(doc) === 'index') {
    chosen = selectLinuxAmd64(parseIndex(doc, `OCI layout ${root}: index ${chosen.digest}`), `OCI layout ${root}`);
    doc = await readDocument(chosen, `manifest ${chosen.digest}`);
  }
  const manifest = parseManifest(doc, `OCI layout ${root}: manifest ${chosen.digest}`);
  const config = parseImageConfig(await readFile(await importBlob(manifest.config, false)), `OCI layout ${root}`);
  checkPlatform(config, `OCI layout ${root}`);
  const layers: ImageLayer[] = [];
  for (const l of manifest.layers) {
    layers.push({ digest: l.digest, mediaType: l.mediaType, size: l.size, path: await importBlob(l, true) });
  }
  return { source, manifestDigest: chosen.digest, configDigest: manifest.config.digest, config, layers };
}
