// A "node" container image for the image-template tests, made here from Debian packages instead of
// pulled (no test reaches outside this machine): an OCI image layout directory (oci-layout,
// index.json, blobs/sha256/...) with two layers, as a registry's node image has a base and what
// is added on top:
//   layer 1 (application/vnd.oci.image.layer.v1.tar, uncompressed): Debian bookworm minbase,
//     with a `node` user (uid/gid 1000, /home/node, as the real node:22 image has);
//   layer 2 (application/vnd.oci.image.layer.v1.tar+gzip): nodejs, npm, git, ca-certificates and
//     everything they pull, as the changes from layer 1 (new and changed files, and a whiteout:
//     layer 1's etc/torpor-fixture/base-only is deleted, so a flattener's whiteout handling is
//     exercised by every image built from it).
// Config: amd64/linux, Env PATH=..., WorkingDir /home/node, User node, Cmd ["node"].
//
// Both root filesystems come from mmdebstrap (root mode, --format=tar), in parallel, from the
// host's own apt sources as guest/image/build.sh picks them; layer 2 is their difference,
// computed here (tar-stream). Debian bookworm's nodejs is 18.x: `node --version` in the guest
// prints v18.*, not v22.
//
// ensureNodeImage keeps the layout in the torpor store (artifacts/test-node-image/<key>/), keyed
// like the root filesystem's base (this file, the host's apt sources and package-index state,
// mmdebstrap's version), so CI builds it once and every later run finds it.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import { createGunzip, createGzip } from 'node:zlib';

import * as tar from 'tar-stream';

import { baseInputs } from '../../lib/setup/rootfs.js';
import { artifactDir, artifactKey, ensureArtifact, MANIFEST, type ArtifactResult } from '../../lib/store/artifact.js';

export const MEDIA = {
  index: 'application/vnd.oci.image.index.v1+json',
  manifest: 'application/vnd.oci.image.manifest.v1+json',
  config: 'application/vnd.oci.image.config.v1+json',
  layerTar: 'application/vnd.oci.image.layer.v1.tar',
  layerGzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
} as const;

/** The tag index.json names the image by (annotation org.opencontainers.image.ref.name). */
export const NODE_IMAGE_REF = 'bookworm';
/** The packages of layer 2. */
export const NODE_IMAGE_PACKAGES = ['nodejs', 'npm', 'git', 'ca-certificates'];
export const NODE_IMAGE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const KIND = 'test-node-image';
/** Every file's mtime in both layers is clamped to this (mmdebstrap honours SOURCE_DATE_EPOCH). */
const SOURCE_DATE_EPOCH = 1735689600; // 2025-01-01T00:00:00Z

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  annotations?: Record<string, string>;
  platform?: { architecture: string; os: string };
}

export interface OciConfig {
  created: string;
  architecture: string;
  os: string;
  config: { User: string; Env: string[]; WorkingDir: string; Cmd: string[]; Labels?: Record<string, string> };
  rootfs: { type: 'layers'; diff_ids: string[] };
  history: Array<{ created: string; created_by: string; comment?: string }>;
}

export interface BuildReport {
  /** The manifest's digest. */
  manifestDigest: string;
  layers: Array<Descriptor & { diffId: string; uncompressedSize: number }>;
  /** Wall-clock milliseconds: both mmdebstrap runs (in parallel), then the layers. */
  mmdebstrapMs: number;
  layersMs: number;
}

// ---- building -------------------------------------------------------------------------------

/** The host's apt sources files, as guest/image/build.sh picks them (APT_SOURCES, else /etc/apt's enabled files). */
function aptSourceFiles(): string[] {
  if (process.env.APT_SOURCES) return process.env.APT_SOURCES.split(/\s+/).filter(Boolean);
  const files: string[] = [];
  const nonEmpty = (p: string) => {
    try {
      return statSync(p).size > 0;
    } catch {
      return false;
    }
  };
  if (nonEmpty('/etc/apt/sources.list') && /^\s*deb\s/m.test(readFileSync('/etc/apt/sources.list', 'utf8'))) files.push('/etc/apt/sources.list');
  let names: string[] = [];
  try {
    names = readdirSync('/etc/apt/sources.list.d').sort();
  } catch {
    /* none */
  }
  for (const name of names) {
    const p = join('/etc/apt/sources.list.d', name);
    if ((name.endsWith('.list') || name.endsWith('.sources')) && nonEmpty(p)) files.push(p);
  }
  return files;
}

/** mmdebstrap's arguments for one of the two root filesystems: the base, or the base with layer 2's packages. */
function mmdebstrapArgs(out: string, withPackages: boolean, sources: string[]): string[] {
  const hooks = [
    'chroot "$1" useradd --create-home --home-dir /home/node --uid 1000 --user-group --shell /bin/bash node',
    'mkdir -p "$1/etc/torpor-fixture"',
    withPackages
      ? 'echo node > "$1/etc/torpor-fixture/layer"'
      : 'echo base > "$1/etc/torpor-fixture/layer" && echo "deleted by layer 2" > "$1/etc/torpor-fixture/base-only"',
  ];
  return [
    '--variant=minbase',
    '--format=tar',
    '--mode=root',
    ...(withPackages ? [`--include=${NODE_IMAGE_PACKAGES.join(',')}`] : []),
    '--aptopt=Acquire::Check-Valid-Until "false"',
    '--aptopt=Acquire::Languages "none"',
    // No fsync per unpacked file: the tree is thrown away after tarring (about a third of the time).
    '--dpkgopt=force-unsafe-io',
    '--dpkgopt=path-exclude=/usr/share/man/*',
    '--dpkgopt=path-exclude=/usr/share/doc/*',
    '--dpkgopt=path-include=/usr/share/doc/*/copyright',
    '--dpkgopt=path-exclude=/usr/share/info/*',
    '--dpkgopt=path-exclude=/usr/share/locale/*',
    '--dpkgopt=path-include=/usr/share/locale/locale.alias',
    '--dpkgopt=path-exclude=/usr/share/lintian/*',
    ...hooks.map((h) => `--customize-hook=${h}`),
    'bookworm',
    out,
    ...sources,
  ];
}

function runMmdebstrap(args: string[], log: (line: string) => void, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('mmdebstrap', args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, SOURCE_DATE_EPOCH: String(SOURCE_DATE_EPOCH), LC_ALL: 'C.UTF-8' },
    });
    let tail = '';
    const onData = (d: Buffer) => {
      const text = d.toString();
      tail = (tail + text).slice(-4000);
      for (const line of text.split('\n')) if (line.startsWith('I: ') || line.startsWith('E: ')) log(`${what}: ${line}`);
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`mmdebstrap (${what}) exited ${code}:\n${tail}`))));
  });
}

/** One tar member as the diff compares it (mtimes are not compared: the content is). */
interface Entry {
  type: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  linkname: string;
  sha256: string;
}

/** 'usr/bin/x' for './usr/bin/x', '' for the root. */
function norm(name: string): string {
  let n = name.replace(/^\.\//, '').replace(/^\/+/, '');
  if (n === '.') n = '';
  return n.replace(/\/+$/, '');
}

/** A hard link's target is an archive path (normalized like names); a symlink's is kept as written. */
function linkOf(header: TarHeader): string {
  if (!header.linkname) return '';
  return header.type === 'link' ? norm(header.linkname) : header.linkname;
}

/** Members left out of both layers: device nodes and the like under dev/ (a real image's /dev is empty). */
function dropped(path: string): boolean {
  return path.startsWith('dev/');
}

function sameEntry(a: Entry, b: Entry): boolean {
  return a.type === b.type && a.mode === b.mode && a.uid === b.uid && a.gid === b.gid && a.size === b.size && a.linkname === b.linkname && a.sha256 === b.sha256;
}

/** A tar header as tar-stream reads and writes it (its `pax` records included). */
type TarHeader = Partial<tar.Header> & { name: string; pax?: Record<string, string> | null };
/** A member's body (tar-stream's streamx Readable; async iterable). */
type Body = AsyncIterable<Uint8Array>;

/** Reads every member of a tar in order: `onEntry(header, path, body)`, which must consume the body. */
async function readTar(input: Readable, onEntry: (header: TarHeader, path: string, body: Body) => Promise<void>): Promise<void> {
  const extract = tar.extract();
  let failed: unknown;
  const feed = (async () => {
    try {
      for await (const chunk of input) {
        if (failed !== undefined) return;
        if (!extract.write(chunk as Buffer)) {
          await new Promise<void>((resolve) => {
            const go = () => {
              extract.off('drain', go);
              extract.off('close', go);
              resolve();
            };
            extract.on('drain', go);
            extract.on('close', go);
          });
        }
      }
      extract.end(undefined as never);
    } catch (err) {
      extract.destroy(err as Error);
      throw err;
    }
  })();
  const done = (async () => {
    try {
      for await (const entry of extract) await onEntry(entry.header as TarHeader, norm(entry.header.name), entry as AsyncIterable<Uint8Array>);
    } catch (err) {
      failed = err;
      input.destroy();
      throw err;
    }
  })();
  await Promise.all([feed, done]);
}

async function drain(body: Body): Promise<void> {
  for await (const _ of body) void _;
}

async function hashBody(body: Body): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of body) h.update(chunk);
  return h.digest('hex');
}

async function entryOf(header: TarHeader, body: Body): Promise<Entry> {
  return {
    type: header.type ?? 'file',
    mode: header.mode ?? 0,
    uid: header.uid ?? 0,
    gid: header.gid ?? 0,
    size: header.size ?? 0,
    linkname: linkOf(header),
    sha256: await hashBody(body),
  };
}

/** A Transform that hashes and counts what passes through. */
function counter(): Transform & { digest(): string; bytes: number } {
  const h = createHash('sha256');
  const t = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      h.update(chunk);
      (t as unknown as { bytes: number }).bytes += chunk.length;
      cb(null, chunk);
    },
  }) as Transform & { digest(): string; bytes: number };
  t.bytes = 0;
  let hex: string | undefined;
  t.digest = () => (hex ??= h.digest('hex'));
  return t;
}

/** The member's header as written into a layer: normalized names, pax path/linkpath dropped (re-derived). */
function layerHeader(header: TarHeader, path: string, isDir: boolean): TarHeader {
  const out: TarHeader = { ...header, name: isDir ? `${path}/` : path };
  if (header.linkname) out.linkname = linkOf(header);
  if (header.pax) {
    const pax = { ...header.pax };
    delete pax.path;
    delete pax.linkpath;
    delete pax.size;
    out.pax = Object.keys(pax).length ? pax : null;
  }
  return out;
}

/** Writes a tar member into the pack, its body copied from `body` (hashed into `hash` when given); a body-less member drains `body`. */
async function packEntry(pack: tar.Pack, header: TarHeader, body: Body | undefined, hash?: ReturnType<typeof createHash>): Promise<void> {
  const hasData = header.type === 'file' || header.type === 'contiguous-file' || header.type === undefined;
  const written = new Promise<void>((resolve, reject) => {
    const w = pack.entry(header as tar.Header, (err) => (err ? reject(err) : resolve()));
    void (async () => {
      try {
        if (body && hasData) {
          for await (const chunk of body) {
            hash?.update(chunk);
            if (!w.write(chunk)) await new Promise<void>((r) => w.once('drain', () => r()));
          }
        } else if (body) await drain(body);
        w.end(undefined as never);
      } catch (err) {
        w.destroy(err as Error);
      }
    })();
  });
  await written;
}

/** Streams `pack` to `file` (gzip when asked); returns the blob's and the tar's digests and sizes. */
function layerSink(pack: tar.Pack, file: string, gzip: boolean): Promise<{ digest: string; size: number; diffId: string; uncompressedSize: number }> {
  const raw = counter();
  const stored = counter();
  const stages: NodeJS.ReadWriteStream[] = gzip ? [raw, createGzip({ level: 6 }), stored] : [raw, stored];
  const done = (pipeline as (...s: unknown[]) => Promise<void>)(Readable.from(pack as AsyncIterable<Uint8Array>), ...stages, createWriteStream(file)).then(() => ({
    digest: `sha256:${stored.digest()}`,
    size: stored.bytes,
    diffId: `sha256:${raw.digest()}`,
    uncompressedSize: raw.bytes,
  }));
  // A failed write (a full disk) ends the pack too, so no member waits on a drain that never comes.
  done.catch((err: Error) => pack.destroy(err));
  return done;
}

/** Layer 1: the base tar, normalized (no ./ prefix, no root entry, no dev/ members). Returns its index. */
async function writeBaseLayer(baseTar: string, blob: string): Promise<{ entries: Map<string, Entry>; layer: Awaited<ReturnType<typeof layerSink>> }> {
  const entries = new Map<string, Entry>();
  const pack = tar.pack();
  const sink = layerSink(pack, blob, false);
  await readTar(createReadStream(baseTar), async (header, path, body) => {
    if (path === '' || dropped(path)) {
      await drain(body);
      return;
    }
    const h = createHash('sha256');
    await packEntry(pack, layerHeader(header, path, header.type === 'directory'), body, h);
    entries.set(path, {
      type: header.type ?? 'file',
      mode: header.mode ?? 0,
      uid: header.uid ?? 0,
      gid: header.gid ?? 0,
      size: header.size ?? 0,
      linkname: linkOf(header),
      sha256: h.digest('hex'),
    });
  });
  pack.finalize();
  return { entries, layer: await sink };
}

/** Layer 2: the members of the full tar that are new or differ from the base, then whiteouts for what it lacks. */
async function writeDiffLayer(fullTar: string, base: Map<string, Entry>, blob: string): Promise<Awaited<ReturnType<typeof layerSink>> & { members: number; whiteouts: number }> {
  // Pass 1: what to emit. A hard link travels with its target (a link into a lower layer is not portable).
  const emit = new Set<string>();
  const present = new Set<string>();
  const links = new Map<string, string[]>();
  await readTar(createReadStream(fullTar), async (header, path, body) => {
    if (path === '' || dropped(path)) {
      await drain(body);
      return;
    }
    present.add(path);
    const e = await entryOf(header, body);
    const old = base.get(path);
    if (!old || !sameEntry(old, e)) emit.add(path);
    if (e.type === 'link') links.set(e.linkname, [...(links.get(e.linkname) ?? []), path]);
  });
  for (const [target, paths] of links) {
    if (emit.has(target) || paths.some((p) => emit.has(p))) {
      emit.add(target);
      for (const p of paths) emit.add(p);
    }
  }
  // Pass 2: write them, in the full tar's order (parents before children).
  const pack = tar.pack();
  const sink = layerSink(pack, blob, true);
  let members = 0;
  await readTar(createReadStream(fullTar), async (header, path, body) => {
    if (!emit.has(path)) {
      await drain(body);
      return;
    }
    members++;
    await packEntry(pack, layerHeader(header, path, header.type === 'directory'), body);
  });
  // Whiteouts: the topmost deleted paths (a deleted directory's children go with it).
  let whiteouts = 0;
  for (const path of [...base.keys()].sort()) {
    if (present.has(path)) continue;
    const parent = path.includes('/') ? path.slice(0, path.lastIndexOf('/')) : '';
    if (parent !== '' && !present.has(parent)) continue;
    const name = path.slice(parent === '' ? 0 : parent.length + 1);
    whiteouts++;
    await packEntry(pack, { name: `${parent ? parent + '/' : ''}.wh.${name}`, type: 'file', mode: 0o644, size: 0, mtime: new Date(SOURCE_DATE_EPOCH * 1000) }, undefined);
  }
  pack.finalize();
  return { ...(await sink), members, whiteouts };
}

function sha256Hex(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/** Writes a JSON blob; returns its descriptor. */
async function putJsonBlob(outDir: string, mediaType: string, value: unknown): Promise<Descriptor> {
  const text = Buffer.from(JSON.stringify(value));
  const hex = sha256Hex(text);
  await writeFile(join(outDir, 'blobs', 'sha256', hex), text);
  return { mediaType, digest: `sha256:${hex}`, size: text.length };
}

/**
 * The layout in `outDir` from two root filesystem tars (mmdebstrap --format=tar): `baseTar` as
 * layer 1, what `fullTar` adds, changes and deletes as layer 2. Deletes both tars when done.
 */
export async function layoutFromTars(outDir: string, baseTar: string, fullTar: string, log: (line: string) => void = () => {}): Promise<Omit<BuildReport, 'mmdebstrapMs' | 'layersMs'>> {
  const blobs = join(outDir, 'blobs', 'sha256');
  await mkdir(blobs, { recursive: true });
  const work = join(outDir, '.layers');
  await mkdir(work, { recursive: true });
  try {
    const tmp1 = join(work, 'layer1');
    const base = await writeBaseLayer(baseTar, tmp1);
    await rm(baseTar);
    const tmp2 = join(work, 'layer2');
    const top = await writeDiffLayer(fullTar, base.entries, tmp2);
    await rm(fullTar);
    log(`layer 2: ${top.members} members, ${top.whiteouts} whiteouts`);
    await rename(tmp1, join(blobs, base.layer.digest.slice(7)));
    await rename(tmp2, join(blobs, top.digest.slice(7)));

    const created = new Date(SOURCE_DATE_EPOCH * 1000).toISOString();
    const config: OciConfig = {
      created,
      architecture: 'amd64',
      os: 'linux',
      config: {
        User: 'node',
        Env: [`PATH=${NODE_IMAGE_PATH}`],
        WorkingDir: '/home/node',
        Cmd: ['node'],
        Labels: { 'org.opencontainers.image.title': 'torpor test node image (Debian bookworm nodejs, npm, git)' },
      },
      rootfs: { type: 'layers', diff_ids: [base.layer.diffId, top.diffId] },
      history: [
        { created, created_by: 'mmdebstrap --variant=minbase bookworm (+ user node, uid 1000)' },
        { created, created_by: `apt-get install ${NODE_IMAGE_PACKAGES.join(' ')}` },
      ],
    };
    const configDesc = await putJsonBlob(outDir, MEDIA.config, config);
    const layers = [
      { mediaType: MEDIA.layerTar, digest: base.layer.digest, size: base.layer.size },
      { mediaType: MEDIA.layerGzip, digest: top.digest, size: top.size },
    ];
    const manifestDesc = await putJsonBlob(outDir, MEDIA.manifest, {
      schemaVersion: 2,
      mediaType: MEDIA.manifest,
      config: configDesc,
      layers,
    });
    await writeFile(
      join(outDir, 'index.json'),
      JSON.stringify({
        schemaVersion: 2,
        mediaType: MEDIA.index,
        manifests: [{ ...manifestDesc, platform: { architecture: 'amd64', os: 'linux' }, annotations: { 'org.opencontainers.image.ref.name': NODE_IMAGE_REF } }],
      }),
    );
    await writeFile(join(outDir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
    return {
      manifestDigest: manifestDesc.digest,
      layers: [
        { ...layers[0]!, diffId: base.layer.diffId, uncompressedSize: base.layer.uncompressedSize },
        { ...layers[1]!, diffId: top.diffId, uncompressedSize: top.uncompressedSize },
      ],
    };
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

/**
 * Builds the node image as an OCI image layout in `outDir` (created; must be empty or absent).
 * Root and mmdebstrap required; minutes (two Debian bootstraps, in parallel). `log` gets
 * mmdebstrap's progress lines.
 */
export async function buildNodeImage(outDir: string, opts: { log?: (line: string) => void } = {}): Promise<BuildReport> {
  const log = opts.log ?? (() => {});
  const sources = aptSourceFiles();
  if (sources.length === 0) throw new Error('buildNodeImage: this host has no apt sources configured under /etc/apt');
  const work = join(outDir, '.work');
  await mkdir(work, { recursive: true });
  try {
    const baseTar = join(work, 'base.tar');
    const fullTar = join(work, 'full.tar');
    let t = Date.now();
    await Promise.all([
      runMmdebstrap(mmdebstrapArgs(baseTar, false, sources), log, 'base'),
      runMmdebstrap(mmdebstrapArgs(fullTar, true, sources), log, 'node'),
    ]);
    const mmdebstrapMs = Date.now() - t;
    t = Date.now();
    const report = await layoutFromTars(outDir, baseTar, fullTar, log);
    return { ...report, mmdebstrapMs, layersMs: Date.now() - t };
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

// ---- the store ------------------------------------------------------------------------------

/** Key inputs: this file, and what decides the packages (as the root filesystem's base). */
async function nodeImageInputs(): Promise<Record<string, string>> {
  const { indexes, mmdebstrap, sources } = await baseInputs();
  const script = await readFile(fileURLToPath(import.meta.url), 'utf8');
  return { 'node-image.ts': script, indexes: indexes!, mmdebstrap: mmdebstrap!, sources: sources! };
}

/** The layout's files, from a stored artifact's manifest (so a stored image is checked file by file). */
async function recordedFiles(dir: string): Promise<string[]> {
  try {
    const m = JSON.parse(await readFile(join(dir, MANIFEST), 'utf8')) as { files?: Record<string, unknown> };
    return Object.keys(m.files ?? {});
  } catch {
    return [];
  }
}

export interface NodeImage {
  /** The OCI image layout directory (read-only files). */
  dir: string;
  built: boolean;
  artifact: ArtifactResult;
}

/** The node image in the store at `root` (homeLayout().artifacts), built there when missing or damaged. */
export async function ensureNodeImage(root: string, opts: { onProgress?: (line: string) => void } = {}): Promise<NodeImage> {
  const inputs = await nodeImageInputs();
  const dir = artifactDir(root, KIND, artifactKey(KIND, inputs));
  if (process.env.TORPOR_NESTED === '1' && !existsSync(join(dir, 'index.json'))) {
    throw new Error(`the node image ${dir} was not carried into the nested host (test/nested/run.ts builds it on the host first)`);
  }
  const files = ['oci-layout', 'index.json'];
  for (const f of await recordedFiles(dir)) if (!files.includes(f)) files.push(f);
  const artifact = await ensureArtifact(
    {
      kind: KIND,
      inputs,
      files,
      build: async (tmp) => {
        const report = await buildNodeImage(tmp, { log: opts.onProgress });
        opts.onProgress?.(
          `built in ${((report.mmdebstrapMs + report.layersMs) / 1000).toFixed(0)} s (mmdebstrap ${(report.mmdebstrapMs / 1000).toFixed(0)} s, layers ${(report.layersMs / 1000).toFixed(0)} s); ` +
            report.layers.map((l, i) => `layer ${i + 1}: ${l.size} bytes (${l.uncompressedSize} as tar)`).join(', '),
        );
        // The file list the store records and checks: what this build wrote.
        files.length = 0;
        files.push('oci-layout', 'index.json');
        const manifestHex = report.manifestDigest.slice(7);
        const manifest = JSON.parse(await readFile(join(tmp, 'blobs', 'sha256', manifestHex), 'utf8')) as { config: Descriptor };
        for (const d of [report.manifestDigest, manifest.config.digest, ...report.layers.map((l) => l.digest)]) files.push(`blobs/sha256/${d.slice(7)}`);
      },
    },
    { root, onWait: (pid) => opts.onProgress?.(`waiting for another build of the node image (pid ${pid ?? '?'})`) },
  );
  return { dir: artifact.dir, built: artifact.built, artifact };
}

/**
 * Where the current node image lives in the store at `root`, built or not: a runner that boots
 * a test host without apt access (the nested host) copies this directory in, as it does the
 * root filesystem's base (lib/setup/rootfs.ts baseArtifactDir).
 */
export async function nodeImageArtifactDir(root: string): Promise<string> {
  return artifactDir(root, KIND, artifactKey(KIND, await nodeImageInputs()));
}

/** Why this host can neither find the node image in the store nor build it; null when it can do one of the two. */
export async function nodeImageSkipReason(root: string): Promise<string | null> {
  const inputs = await nodeImageInputs();
  const dir = artifactDir(root, KIND, artifactKey(KIND, inputs));
  if ((await recordedFiles(dir)).length > 0 && existsSync(join(dir, 'index.json'))) return null;
  // The nested host has no apt: its runner builds the image on the host and carries it in. Here a
  // missing image is the runner's failure, reported by the test as one (ensureNodeImage's), not a skip.
  if (process.env.TORPOR_NESTED === '1') return null;
  if (process.getuid?.() !== 0) return `the node image is not in the store (${root}) and building it needs root (mmdebstrap's root mode)`;
  const which = await new Promise<boolean>((resolve) => {
    const c = spawn('sh', ['-c', 'command -v mmdebstrap'], { stdio: 'ignore' });
    c.on('close', (code) => resolve(code === 0));
    c.on('error', () => resolve(false));
  });
  if (!which) return 'the node image is not in the store and building it needs mmdebstrap (apt-get install mmdebstrap)';
  if (aptSourceFiles().length === 0) return 'the node image is not in the store and this host has no apt sources';
  return null;
}

// ---- reading a layout back ------------------------------------------------------------------

export interface CheckedLayout {
  ref: string | undefined;
  manifestDigest: string;
  config: OciConfig;
  layers: Descriptor[];
}

async function blobHash(path: string, gunzip: boolean): Promise<{ digest: string; size: number; diffId: string }> {
  const stored = counter();
  const raw = counter();
  const sink = new Transform({ transform: (_c, _e, cb) => cb() });
  sink.resume();
  if (gunzip) await pipeline(createReadStream(path), stored, createGunzip(), raw, sink);
  else await pipeline(createReadStream(path), stored, sink);
  return { digest: `sha256:${stored.digest()}`, size: stored.bytes, diffId: gunzip ? `sha256:${raw.digest()}` : `sha256:${stored.digest()}` };
}

function blobPath(dir: string, digest: string): string {
  const m = /^sha256:([0-9a-f]{64})$/.exec(digest);
  if (!m) throw new Error(`not a sha256 digest: ${digest}`);
  return join(dir, 'blobs', 'sha256', m[1]!);
}

async function readJsonBlob<T>(dir: string, d: Descriptor): Promise<T> {
  const buf = await readFile(blobPath(dir, d.digest));
  if (buf.length !== d.size) throw new Error(`${d.digest}: ${buf.length} bytes, descriptor says ${d.size}`);
  if (`sha256:${sha256Hex(buf)}` !== d.digest) throw new Error(`${d.digest}: content does not match its digest`);
  return JSON.parse(buf.toString('utf8')) as T;
}

/**
 * Reads an OCI image layout and checks it: oci-layout's version, index → manifest → config and
 * layers (each blob's size and sha256 against its descriptor, media types, each layer's
 * uncompressed digest against the config's diff_ids). Throws on the first mismatch.
 */
export async function checkOciLayout(dir: string): Promise<CheckedLayout> {
  const layout = JSON.parse(await readFile(join(dir, 'oci-layout'), 'utf8')) as { imageLayoutVersion?: string };
  if (layout.imageLayoutVersion !== '1.0.0') throw new Error(`oci-layout: imageLayoutVersion ${layout.imageLayoutVersion}`);
  const index = JSON.parse(await readFile(join(dir, 'index.json'), 'utf8')) as { schemaVersion: number; mediaType?: string; manifests: Descriptor[] };
  if (index.schemaVersion !== 2 || index.mediaType !== MEDIA.index) throw new Error('index.json: not an OCI image index');
  const desc = index.manifests[0];
  if (!desc || desc.mediaType !== MEDIA.manifest) throw new Error('index.json: no image manifest');
  const manifest = await readJsonBlob<{ schemaVersion: number; mediaType: string; config: Descriptor; layers: Descriptor[] }>(dir, desc);
  if (manifest.schemaVersion !== 2 || manifest.mediaType !== MEDIA.manifest) throw new Error('manifest: not an OCI image manifest');
  if (manifest.config.mediaType !== MEDIA.config) throw new Error(`manifest: config media type ${manifest.config.mediaType}`);
  const config = await readJsonBlob<OciConfig>(dir, manifest.config);
  if (config.rootfs.diff_ids.length !== manifest.layers.length) throw new Error('config: diff_ids and layers differ in number');
  for (const [i, layer] of manifest.layers.entries()) {
    if (layer.mediaType !== MEDIA.layerTar && layer.mediaType !== MEDIA.layerGzip) throw new Error(`layer ${i}: media type ${layer.mediaType}`);
    const st = await stat(blobPath(dir, layer.digest));
    if (st.size !== layer.size) throw new Error(`layer ${i}: ${st.size} bytes, descriptor says ${layer.size}`);
    const h = await blobHash(blobPath(dir, layer.digest), layer.mediaType === MEDIA.layerGzip);
    if (h.digest !== layer.digest) throw new Error(`layer ${i}: content does not match ${layer.digest}`);
    if (h.diffId !== config.rootfs.diff_ids[i]) throw new Error(`layer ${i}: uncompressed digest ${h.diffId}, config says ${config.rootfs.diff_ids[i]}`);
  }
  return { ref: desc.annotations?.['org.opencontainers.image.ref.name'], manifestDigest: desc.digest, config, layers: manifest.layers };
}

export interface LayerMember {
  type: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  linkname: string;
}

/** The members of one layer, by path ('usr/bin/node'). */
export async function layerEntries(dir: string, layer: Descriptor): Promise<Map<string, LayerMember>> {
  const out = new Map<string, LayerMember>();
  const file = createReadStream(blobPath(dir, layer.digest));
  const input: Readable = layer.mediaType === MEDIA.layerGzip ? file.pipe(createGunzip()) : file;
  await readTar(input, async (header, path, body) => {
    await drain(body);
    out.set(path, {
      type: header.type ?? 'file',
      mode: header.mode ?? 0,
      uid: header.uid ?? 0,
      gid: header.gid ?? 0,
      size: header.size ?? 0,
      linkname: header.linkname ?? '',
    });
  });
  return out;
}
