// An OCI image layout of one layer, written from a root filesystem tarball: what the release's
// base image is (scripts/build-base-image.ts) and what setup makes of a Debian tree built without
// root (lib/setup/base-debian-user.ts) before the image pipeline turns it into ext4. The layer is
// the tarball gzipped; its diff_id and digest are hashed on the way, so nothing is read twice.
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGzip } from 'node:zlib';

import { MEDIA } from './manifest.js';

/** Debian's default PATH: what the agent and a `docker run` of the image start with. */
export const DEBIAN_PATH = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export interface LayoutOptions {
  /** The `org.opencontainers.image.ref.name` of the manifest. */
  tag: string;
  /** 1 (fast) to 9 (smallest). */
  gzipLevel: number;
  /** What made the layer, for the config's history. */
  createdBy: string;
}

export interface WrittenLayout {
  manifestDigest: string;
  layer: { digest: string; size: number; diffId: string; tarBytes: number };
}

/** A stream stage that hashes and counts what passes through it. */
function counter(): Transform & { digest: () => string; bytes: () => number } {
  const hash = createHash('sha256');
  let n = 0;
  const t = new Transform({
    transform(chunk: Buffer, _enc, done) {
      hash.update(chunk);
      n += chunk.length;
      done(null, chunk);
    },
  });
  return Object.assign(t, { digest: () => `sha256:${hash.digest('hex')}`, bytes: () => n });
}

/** Writes `layout` (replacing what was there) holding one linux/amd64 image of `tarPath`. */
export async function writeOneLayerLayout(tarPath: string, layout: string, opts: LayoutOptions): Promise<WrittenLayout> {
  await rm(layout, { recursive: true, force: true });
  const blobs = join(layout, 'blobs', 'sha256');
  await mkdir(blobs, { recursive: true });
  const putBlob = async (bytes: Buffer): Promise<string> => {
    const digest = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    await writeFile(join(blobs, digest.slice(7)), bytes);
    return digest;
  };

  const raw = counter();
  const packed = counter();
  const layerTmp = join(blobs, 'layer.tmp');
  await pipeline(createReadStream(tarPath), raw, createGzip({ level: opts.gzipLevel }), packed, createWriteStream(layerTmp));
  const layer = { digest: packed.digest(), size: packed.bytes(), diffId: raw.digest(), tarBytes: raw.bytes() };
  await rename(layerTmp, join(blobs, layer.digest.slice(7)));

  const config = Buffer.from(
    JSON.stringify({
      architecture: 'amd64',
      os: 'linux',
      config: { Env: [DEBIAN_PATH], Cmd: ['/bin/bash'], WorkingDir: '/', User: '' },
      rootfs: { type: 'layers', diff_ids: [layer.diffId] },
      history: [{ created_by: opts.createdBy }],
    }),
  );
  const configDigest = await putBlob(config);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: MEDIA.ociManifest,
      config: { mediaType: MEDIA.ociConfig, digest: configDigest, size: config.length },
      layers: [{ mediaType: MEDIA.ociLayerGzip, digest: layer.digest, size: layer.size }],
    }),
  );
  const manifestDigest = await putBlob(manifest);
  await writeFile(join(layout, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  await writeFile(
    join(layout, 'index.json'),
    JSON.stringify({
      schemaVersion: 2,
      mediaType: MEDIA.ociIndex,
      manifests: [{ mediaType: MEDIA.ociManifest, digest: manifestDigest, size: manifest.length, annotations: { 'org.opencontainers.image.ref.name': opts.tag } }],
    }),
  );
  return { manifestDigest, layer };
}
