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
  /** The CPU architecture the image is for ('amd64'). */
  architecture: string;
  /** The OS the image is for ('linux'). */
  os: string;
  /** 'KEY=value' entries, in order. */
  env: string[];
  /** The image's WorkingDir ('' when it sets none). */
  workingDir: string;
  /** '' (root), 'name', 'uid', 'name:group' or 'uid:gid', as the image says. */
  user: string;
  /** The image's Entrypoint (recorded, never run by torpor). */
  entrypoint: string[];
  /** The image's Cmd (recorded, never run by torpor). */
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

/** Progress of an image's fetch and unpack, as {@link TemplateBuildOpts.onProgress} reports it. */
export type ImageProgress =
  | {
      /** Resolving the reference to a manifest (registry, OCI layout or docker archive). */
      phase: 'resolve';
      /** What is being resolved, in words. */
      message: string;
    }
  | {
      /** Downloading (or finding in the store) one layer blob. */
      phase: 'download';
      /** The blob's 'sha256:...' digest. */
      digest: string;
      /** Bytes of the blob so far. */
      bytes: number;
      /** The blob's size in bytes. */
      total: number;
      /** true: the blob was already in the store, nothing was downloaded. */
      cached: boolean;
    }
  | {
      /** Unpacking the layers into one root filesystem tree. */
      phase: 'unpack';
      /** What is being unpacked, in words. */
      message: string;
      /** Bytes unpacked so far, when known. */
      bytes?: number;
      /** Bytes to unpack, when known. */
      total?: number;
    }
  | {
      /** Making the ext4 root filesystem from the tree (the agent injected). */
      phase: 'ext4';
      /** What is being done, in words. */
      message: string;
    };
