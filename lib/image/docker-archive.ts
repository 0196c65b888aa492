// An image from a `docker save` archive: a tar holding manifest.json ([{Config, RepoTags,
// Layers}]) and the files it names, in docker's legacy layout (<id>/layer.tar, <hex>.json, with
// a layer shared by two saved images written once and symlinked) or the OCI-style layout of
// docker 25+ (blobs/sha256/<hex>). Layers are uncompressed tars with no digest recorded beside
// them, so their digests are computed here while they are copied into the blob store.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { posix, resolve } from 'node:path';
import { pipeline } from 'node:stream/promises';

import * as tar from 'tar-stream';

import { TorporError } from '../errors.js';
import { torporHome } from '../store/home.js';
import { BlobStore } from './blob-store.js';
import { checkPlatform, parseImageConfig } from './config.js';
import { MEDIA } from './manifest.js';
import type { LocalImageOptions } from './oci-layout.js';
import type { ImageLayer, PulledImage } from './types.js';

function invalid(file: string, why: string, cause?: unknown): TorporError {
  return new TorporError('IMAGE_INVALID', `docker archive ${file}: ${why}`, cause === undefined ? {} : { cause });
}

/** 'a/./b/../c' -> 'a/c'; './x' -> 'x'. */
function clean(name: string): string {
  return posix.normalize(name).replace(/^(\.\/)+/, '').replace(/\/$/, '');
}

/** Reads the archive once, handing each regular file's name and content to `onFile` (which must consume or skip it). */
async function scan(
  file: string,
  onFile: (name: string, body: AsyncIterable<Buffer>) => Promise<boolean>,
  onLink?: (name: string, target: string) => void,
): Promise<void> {
  const extract = tar.extract();
  const reading = pipeline(createReadStream(file), extract);
  try {
    for await (const entry of extract) {
      const name = clean(entry.header.name);
      let consumed = false;
      if (entry.header.type === 'file' || entry.header.type === 'contiguous-file') {
        consumed = await onFile(name, entry as AsyncIterable<Buffer>);
      } else if ((entry.header.type === 'symlink' || entry.header.type === 'link') && entry.header.linkname) {
        // A symlink is relative to its own directory; a hard link names a path from the archive root.
        const target = entry.header.type === 'symlink' ? posix.join(posix.dirname(name), entry.header.linkname) : entry.header.linkname;
        onLink?.(name, clean(target));
      }
      if (!consumed) entry.resume();
    }
    await reading;
  } catch (err) {
    reading.catch(() => {});
    if (err instanceof TorporError) throw err;
    throw invalid(file, `not a readable tar archive (${(err as Error).message})`, err);
  }
}

async function collect(body: AsyncIterable<Buffer>, limit: number, what: string, file: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const chunk of body) {
    n += chunk.length;
    if (n > limit) throw invalid(file, `${what} is larger than ${limit} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

/** The layer's media type by its first bytes: docker save writes plain tars, but a hand-made archive may not. */
function sniffMediaType(head: Buffer): string {
  if (head[0] === 0x1f && head[1] === 0x8b) return MEDIA.ociLayerGzip;
  if (head.readUInt32LE(0) === 0xfd2fb528) return MEDIA.ociLayerZstd;
  return MEDIA.ociLayerTar;
}

interface SavedImage {
  Config: string;
  RepoTags?: string[] | null;
  Layers: string[];
}

export async function fromDockerArchive(archive: string, opts: LocalImageOptions = {}): Promise<PulledImage> {
  const file = resolve(archive);
  const source = `docker-archive:${file}`;
  const st = await stat(file).catch(() => null);
  if (!st?.isFile()) throw invalid(file, 'no such file');
  const store = new BlobStore(opts.home ?? torporHome());

  // Pass 1: manifest.json (anywhere in the archive; docker writes it last) and the links.
  let manifestBytes: Buffer | undefined;
  const links = new Map<string, string>();
  await scan(
    file,
    async (name, body) => {
      if (name !== 'manifest.json') return false;
      manifestBytes = await collect(body, 4 << 20, 'manifest.json', file);
      return true;
    },
    (name, target) => links.set(name, target),
  );
  if (!manifestBytes) throw invalid(file, 'no manifest.json (is this a `docker save` archive?)');
  let saved: SavedImage[];
  try {
    saved = JSON.parse(manifestBytes.toString('utf8')) as SavedImage[];
  } catch (err) {
    throw invalid(file, `manifest.json is not JSON (${(err as Error).message})`);
  }
  const shapeOk = (s: SavedImage) => typeof s?.Config === 'string' && Array.isArray(s.Layers) && s.Layers.every((l) => typeof l === 'string');
  if (!Array.isArray(saved) || saved.length === 0 || !saved.every(shapeOk)) throw invalid(file, 'manifest.json is not a list of {Config, Layers}');
  let image: SavedImage;
  if (opts.tag !== undefined) {
    const hit = saved.find((s) => (s.RepoTags ?? []).some((t) => t === opts.tag || t.endsWith(`/${opts.tag}`)));
    if (!hit) throw invalid(file, `no image tagged ${JSON.stringify(opts.tag)} (it holds ${saved.flatMap((s) => s.RepoTags ?? []).join(', ') || 'untagged images'})`);
    image = hit;
  } else if (saved.length === 1) {
    image = saved[0]!;
  } else {
    throw invalid(file, `it holds ${saved.length} images (${saved.flatMap((s) => s.RepoTags ?? []).join(', ')}); name one with its tag`);
  }

  // Follow symlinks (and chains of them) to the file that holds the bytes.
  const real = (name: string): string => {
    let n = clean(name);
    for (let i = 0; i < 16 && links.has(n); i++) n = links.get(n)!;
    return n;
  };
  const wanted = new Set([real(image.Config), ...image.Layers.map(real)]);

  // Pass 2: copy the config and the layers into the store, hashing them.
  const imported = new Map<string, { digest: string; size: number; path: string; mediaType: string }>();
  await scan(file, async (name, body) => {
    if (!wanted.has(name) || imported.has(name)) return false;
    let head: Buffer | undefined;
    async function* peek(): AsyncGenerator<Buffer> {
      for await (const chunk of body) {
        if (!head) head = Buffer.from(chunk.subarray(0, 4));
        yield chunk;
      }
    }
    const blob = await store.importStream(peek(), {}, source);
    const mediaType = head && head.length >= 4 ? sniffMediaType(head) : MEDIA.ociLayerTar;
    imported.set(name, { ...blob, mediaType });
    return true;
  });
  for (const name of wanted) if (!imported.has(name)) throw invalid(file, `manifest.json names ${name}, which the archive does not hold`);

  const configBlob = imported.get(real(image.Config))!;
  // The legacy layout names the config <hex>.json, the newer one blobs/sha256/<hex>: either way its name is its digest.
  const named = /([a-f0-9]{64})(?:\.json)?$/.exec(real(image.Config));
  if (named && `sha256:${named[1]}` !== configBlob.digest) throw invalid(file, `config ${image.Config} hashes to ${configBlob.digest}, not the digest its name says`);
  const config = parseImageConfig(await collect(createReadStream(configBlob.path), 16 << 20, 'the config', file), `docker archive ${file}`);
  checkPlatform(config, `docker archive ${file}`);

  const layers: ImageLayer[] = image.Layers.map((l) => {
    const b = imported.get(real(l))!;
    return { digest: b.digest, mediaType: b.mediaType, size: b.size, path: b.path };
  });
  for (const l of layers) opts.onProgress?.({ phase: 'download', digest: l.digest, bytes: l.size, total: l.size, cached: false });

  // The image has no registry manifest; write the OCI manifest it would have had, so it has a
  // manifest digest like every other source (and the same one for the same archive).
  const manifest = {
    schemaVersion: 2,
    mediaType: MEDIA.ociManifest,
    config: { mediaType: MEDIA.ociConfig, digest: configBlob.digest, size: configBlob.size },
    layers: layers.map((l) => ({ mediaType: l.mediaType, digest: l.digest, size: l.size })),
  };
  const bytes = Buffer.from(JSON.stringify(manifest));
  const manifestDigest = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
  await store.putBytes(manifestDigest, bytes, source);
  return { source, manifestDigest, configDigest: configBlob.digest, config, layers };
}
