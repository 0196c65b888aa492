// npm run build:base-image: torpor's base root filesystem as a container image, the default
// base a release names so that a user's first run needs neither root nor mmdebstrap. The tree is
// the one the Debian build makes (guest/image/build.sh --tar: the same packages, users and
// hooks), as one gzip layer in an OCI image layout; torpor's base record (base-image.json at the
// package root, shipped in torpor's tarball) names the image by digest.
//
//   node --import tsx scripts/build-base-image.ts --layout DIR [--repository REPO] [--tag TAG]
//                                                 [--record FILE] [--from DIR] [--gzip-level N] [--json]
//
// --from takes a tree build.sh --tar wrote earlier (DIR/base.tar, DIR/packages.txt) instead of
// running it; --gzip-level (default 9) trades the download's size for the time to pack it.
// Publishing is one copy that keeps the digest, by the release (the layout's bytes are the
// image's: skopeo uploads them unchanged):
//   skopeo copy --preserve-digests oci:DIR:TAG docker://REPO:TAG
// With --repository the record is written (REPO@sha256:...); without it only the layout.
// Needs root (mmdebstrap's root mode, as the ext4 base does) and the host's apt sources.
import { spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

import { writeOneLayerLayout } from '../lib/image/layout-writer.js';
import { parseImageReference } from '../lib/image/reference.js';
import { BASE_RECORD, type BaseRelease, parseBaseRelease } from '../lib/setup/base-image.js';
import { packageRoot } from '../lib/setup/paths.js';

const { values } = parseArgs({
  options: {
    layout: { type: 'string' },
    repository: { type: 'string' },
    tag: { type: 'string', default: 'bookworm' },
    record: { type: 'string', default: join(packageRoot, BASE_RECORD) },
    from: { type: 'string' },
    'gzip-level': { type: 'string', default: '9' },
    json: { type: 'boolean', default: false },
  },
});
const gzipLevel = Number(values['gzip-level']);
if (!Number.isInteger(gzipLevel) || gzipLevel < 1 || gzipLevel > 9) {
  process.stderr.write(`--gzip-level: ${values['gzip-level']} is not 1 to 9\n`);
  process.exit(2);
}
if (!values.layout) {
  process.stderr.write('usage: build-base-image.ts --layout DIR [--repository REPO] [--tag TAG] [--record FILE] [--json]\n');
  process.exit(2);
}
if (values.repository) parseImageReference(`${values.repository}:${values.tag}`); // a bad name fails before the build
const layout = resolve(values.layout);
const started = Date.now();

const work = await mkdtemp(join(tmpdir(), 'torpor-base-image-'));
try {
  const tree = values.from ? resolve(values.from) : work;
  if (!values.from) {
    const build = spawnSync(join(packageRoot, 'guest', 'image', 'build.sh'), ['--tar', work], { stdio: ['ignore', process.stderr, 'inherit'] });
    if (build.status !== 0) throw new Error(`guest/image/build.sh --tar failed (exit ${build.status ?? build.signal})`);
  }
  const tarPath = join(tree, 'base.tar');
  const packages = (await readFile(join(tree, 'packages.txt'), 'utf8')).trim().split('\n').length;

  const { manifestDigest, layer } = await writeOneLayerLayout(tarPath, layout, {
    tag: values.tag!,
    gzipLevel,
    createdBy: 'torpor guest/image/build.sh --tar (Debian bookworm, mmdebstrap)',
  });

  let release: BaseRelease | undefined;
  if (values.repository) {
    release = { reference: `${values.repository}@${manifestDigest}`, tag: values.tag!, layer: { digest: layer.digest, size: layer.size, tarBytes: layer.tarBytes }, packages };
    const text = JSON.stringify(release, null, 2) + '\n';
    parseBaseRelease(text, 'the new record'); // what torpor will read must parse
    await writeFile(`${values.record}.tmp`, text);
    await rename(`${values.record}.tmp`, values.record!);
  }
  const summary = {
    layout,
    tag: values.tag,
    manifestDigest,
    layer,
    packages,
    record: release ? values.record : null,
    reference: release?.reference ?? null,
    seconds: (Date.now() - started) / 1000,
  };
  if (values.json) process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
  else
    process.stdout.write(
      `base image ${manifestDigest} in ${layout} (tag ${values.tag})\n` +
        `  layer ${layer.digest}: ${(layer.size / 2 ** 20).toFixed(1)} MiB gzip of a ${(layer.tarBytes / 2 ** 20).toFixed(1)} MiB tar, ${packages} packages\n` +
        (release ? `record: ${values.record} names ${release.reference}\n` : 'no --repository: no record written\n') +
        `  (${summary.seconds.toFixed(1)} s; publish with: skopeo copy --preserve-digests oci:${layout}:${values.tag} docker://${values.repository ?? 'REPO'}:${values.tag})\n`,
    );
} finally {
  await rm(work, { recursive: true, force: true });
}
