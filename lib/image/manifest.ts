// Manifests and indexes (OCI and docker's v2 equivalents): parsing, the layer media types torpor
// can unpack, and choosing the linux/amd64 entry of a multi-platform index. Shared by the
// registry client and the OCI layout reader, which see the same documents.
import { TorporError } from '../errors.js';

export const MEDIA = {
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  dockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  ociConfig: 'application/vnd.oci.image.config.v1+json',
  dockerConfig: 'application/vnd.docker.container.image.v1+json',
  ociLayerTar: 'application/vnd.oci.image.layer.v1.tar',
  ociLayerGzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
  ociLayerZstd: 'application/vnd.oci.image.layer.v1.tar+zstd',
  dockerLayerGzip: 'application/vnd.docker.image.rootfs.diff.tar.gzip',
} as const;

/** What the unpacker understands. Foreign (non-distributable) layers and docker's
 *  schema-1 images are refused here, before anything is downloaded. */
export const LAYER_MEDIA_TYPES: ReadonlySet<string> = new Set([
  MEDIA.ociLayerTar,
  MEDIA.ociLayerGzip,
  MEDIA.ociLayerZstd,
  MEDIA.dockerLayerGzip,
]);

export const INDEX_MEDIA_TYPES: ReadonlySet<string> = new Set([MEDIA.ociIndex, MEDIA.dockerList]);
export const MANIFEST_MEDIA_TYPES: ReadonlySet<string> = new Set([MEDIA.ociManifest, MEDIA.dockerManifest]);

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  platform?: { os?: string; architecture?: string; variant?: string };
  annotations?: Record<string, string>;
}

export interface ImageManifest {
  mediaType: string;
  config: Descriptor;
  layers: Descriptor[];
}

export interface ImageIndex {
  mediaType: string;
  manifests: Descriptor[];
}

const DIGEST = /^sha256:[a-f0-9]{64}$/;

function invalid(what: string, why: string): TorporError {
  return new TorporError('IMAGE_INVALID', `${what}: ${why}`);
}

function descriptor(value: unknown, what: string, field: string): Descriptor {
  if (typeof value !== 'object' || value === null) throw invalid(what, `${field} is not a descriptor`);
  const d = value as Record<string, unknown>;
  if (typeof d.digest !== 'string' || !DIGEST.test(d.digest)) {
    throw invalid(what, `${field} has digest ${JSON.stringify(d.digest)}; torpor reads sha256 digests only`);
  }
  if (typeof d.size !== 'number' || !Number.isSafeInteger(d.size) || d.size < 0) throw invalid(what, `${field} has no valid size`);
  if (typeof d.mediaType !== 'string') throw invalid(what, `${field} has no mediaType`);
  const out: Descriptor = { mediaType: d.mediaType, digest: d.digest, size: d.size };
  if (typeof d.platform === 'object' && d.platform !== null) out.platform = d.platform as Descriptor['platform'] & object;
  if (typeof d.annotations === 'object' && d.annotations !== null) out.annotations = d.annotations as Record<string, string>;
  return out;
}

/** The document's kind: its own mediaType field, else the one it was served as, else its shape. */
export function documentKind(doc: Record<string, unknown>, servedAs?: string): 'index' | 'manifest' | 'unknown' {
  const type = typeof doc.mediaType === 'string' ? doc.mediaType : (servedAs ?? '').split(';')[0]!.trim();
  if (INDEX_MEDIA_TYPES.has(type)) return 'index';
  if (MANIFEST_MEDIA_TYPES.has(type)) return 'manifest';
  if (Array.isArray(doc.manifests)) return 'index';
  if (Array.isArray(doc.layers) && doc.config !== undefined) return 'manifest';
  return 'unknown';
}

export function parseJson(bytes: Buffer, what: string): Record<string, unknown> {
  let doc: unknown;
  try {
    doc = JSON.parse(bytes.toString('utf8'));
  } catch (err) {
    throw invalid(what, `not JSON (${(err as Error).message})`);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) throw invalid(what, 'not a JSON object');
  return doc as Record<string, unknown>;
}

export function parseIndex(doc: Record<string, unknown>, what: string): ImageIndex {
  if (!Array.isArray(doc.manifests)) throw invalid(what, 'index has no manifests list');
  return {
    mediaType: typeof doc.mediaType === 'string' ? doc.mediaType : MEDIA.ociIndex,
    manifests: doc.manifests.map((m, i) => descriptor(m, what, `manifests[${i}]`)),
  };
}

/** A manifest with its layers checked against what torpor can unpack. */
export function parseManifest(doc: Record<string, unknown>, what: string): ImageManifest {
  if (doc.schemaVersion !== 2) {
    throw invalid(what, `manifest schemaVersion ${JSON.stringify(doc.schemaVersion)}; torpor reads schema 2 (OCI or docker v2) only`);
  }
  if (!Array.isArray(doc.layers)) throw invalid(what, 'manifest has no layers list');
  const config = descriptor(doc.config, what, 'config');
  const layers = doc.layers.map((l, i) => descriptor(l, what, `layers[${i}]`));
  for (const [i, l] of layers.entries()) {
    if (!LAYER_MEDIA_TYPES.has(l.mediaType)) {
      throw invalid(what, `layer ${i} (${l.digest}) has media type ${l.mediaType}; torpor unpacks ${[...LAYER_MEDIA_TYPES].join(', ')}`);
    }
  }
  return { mediaType: typeof doc.mediaType === 'string' ? doc.mediaType : MEDIA.ociManifest, config, layers };
}

function platformName(d: Descriptor): string {
  const p = d.platform;
  if (!p) return 'unknown';
  return `${p.os ?? '?'}/${p.architecture ?? '?'}${p.variant ? `/${p.variant}` : ''}`;
}

/**
 * The index's linux/amd64 image manifest. Attestation manifests (buildx's 'unknown/unknown'
 * entries) and nested indexes are skipped; with none, IMAGE_PLATFORM lists what there is.
 */
export function selectLinuxAmd64(index: ImageIndex, what: string): Descriptor {
  const candidates = index.manifests.filter(
    (d) => d.platform?.os === 'linux' && d.platform.architecture === 'amd64' && !INDEX_MEDIA_TYPES.has(d.mediaType),
  );
  // amd64 has no variants in practice; prefer an entry without one, then v1, over v2/v3 ones
  // (which need a newer CPU than the guest may report).
  candidates.sort((a, b) => (a.platform?.variant ?? '').localeCompare(b.platform?.variant ?? ''));
  const pick = candidates[0];
  if (pick) return pick;
  const available = [...new Set(index.manifests.map(platformName))].filter((p) => p !== 'unknown/unknown');
  throw new TorporError(
    'IMAGE_PLATFORM',
    `${what} has no linux/amd64 image; it has ${available.length ? available.join(', ') : 'no platform entries'}`,
  );
}
