// What an image source (a registry, an OCI layout, a docker archive) hands the rest of torpor:
// the image's config and its layers as verified blobs in the store, bottom layer first.
// Everything after the fetch (flattening, the ext4, the template) reads only this.

/** One layer blob, already checked against its digest and stored under images/blobs/. */
export interface ImageLayer {
  /** 'sha256:<64 hex>' of the blob as stored (compressed, as the manifest names it). */
  digest: string;
  /** The manifest's media type (tar, tar+gzip, tar+zstd; docker's equivalents). */
  mediaType: string;
  size: number;
  /** Absolute path of the blob file. */
  path: string;
}

/** The part of an OCI/docker image config that torpor applies or records. */
export interface ImageConfig {
  architecture: string;
  os: string;
  /** 'KEY=value' entries, in order. */
  env: string[];
  workingDir: string;
  /** '' (root), 'name', 'uid', 'name:group' or 'uid:gid', as the image says. */
  user: string;
  entrypoint: string[];
  cmd: string[];
}

/** An image ready to unpack. */
export interface PulledImage {
  /** Where it came from, for messages and TemplateInfo ('node:22', 'oci-layout:/dir', 'docker-archive:/f.tar'). */
  source: string;
  /** The digest of the image manifest (for a registry image resolved from a list: the linux/amd64 one). */
  manifestDigest: string;
  /** The digest of the config blob: the image's identity (two tags of one image share it). */
  configDigest: string;
  config: ImageConfig;
  layers: ImageLayer[];
}

export type ImageProgress =
  | { phase: 'resolve'; message: string }
  | { phase: 'download'; digest: string; bytes: number; total: number; cached: boolean }
  | { phase: 'unpack'; message: string; bytes?: number; total?: number }
  | { phase: 'ext4'; message: string };
