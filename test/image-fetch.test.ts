// lib/image's fetch side against a real registry (Debian's docker-registry, started here on
// 127.0.0.1 with its own storage), an in-process token server, and layouts written by this
// file's own code (and by skopeo where it is installed): references, platforms, not-found,
// corrupt and resumed blobs, the shared cache, basic and token auth, OCI layouts and docker
// archives. Nothing leaves this machine.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { gunzipSync } from 'node:zlib';
import { spawnSync } from 'node:child_process';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { parseChallenges, loadCredentials } from '../lib/image/auth.js';
import { blobDir } from '../lib/image/blob-store.js';
import { parseImageConfig } from '../lib/image/config.js';
import { fetchImage, fromDockerArchive, fromOciLayout, parseImageReference, pullImage } from '../lib/image/index.js';
import type { ImageProgress, PulledImage } from '../lib/image/types.js';
import { testUnless } from './skip-unless.js';
import {
  blob,
  dockerConfig,
  freePort,
  gzLayer,
  makeCertificate,
  makeHtpasswd,
  makeImage,
  makeIndex,
  makeTar,
  needsPrograms,
  Pusher,
  sha256,
  startProxy,
  startRegistry,
  startTokenServer,
  type TestImage,
  type TestRegistry,
} from './image-registry.js';

const FILE = 'image-fetch';
const registryTest = testUnless(FILE, needsPrograms('docker-registry'), 'tools');
const basicAuthTest = testUnless(FILE, needsPrograms('docker-registry', 'htpasswd'), 'tools');
const tokenAuthTest = testUnless(FILE, needsPrograms('docker-registry', 'openssl'), 'tools');
const skopeoTest = testUnless(FILE, needsPrograms('docker-registry', 'skopeo'), 'tools');

const work = mkdtempSync(join(tmpdir(), 'torpor-image-fetch-'));
const cleanups: (() => Promise<void>)[] = [];
let homes = 0;
async function newHome(): Promise<string> {
  const h = join(work, `home-${++homes}`);
  await mkdir(h, { recursive: true });
  return h;
}
/** An environment without the user's own docker credentials. */
const noCreds: NodeJS.ProcessEnv = { HOME: join(work, 'nohome'), DOCKER_CONFIG: join(work, 'no-docker-config') };

async function code(p: Promise<unknown>): Promise<TorporError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof TorporError) return err;
    throw err;
  }
  throw new Error('expected a TorporError');
}

// One plain registry for the file, started on first use.
let plain: Promise<{ reg: TestRegistry; push: Pusher }> | undefined;
function plainRegistry(): Promise<{ reg: TestRegistry; push: Pusher }> {
  plain ??= (async () => {
    const dir = join(work, 'registry');
    await mkdir(dir, { recursive: true });
    const reg = await startRegistry(dir);
    cleanups.push(() => reg.stop());
    return { reg, push: new Pusher(reg.host) };
  })();
  return plain;
}

async function base(): Promise<{ base: Awaited<ReturnType<typeof gzLayer>>; app: Awaited<ReturnType<typeof gzLayer>> }> {
  return {
    base: await gzLayer({ 'etc/os-release': 'ID=test\n', 'bin/sh': 'not really a shell\n' }),
    app: await gzLayer({ 'app/main.js': 'console.log(1)\n' }),
  };
}

async function checkLayers(pulled: PulledImage, img: TestImage): Promise<void> {
  assert.is(pulled.layers.length, img.layers.length);
  for (const [i, l] of pulled.layers.entries()) {
    assert.is(l.digest, img.layers[i]!.digest);
    assert.is(l.size, img.layers[i]!.bytes.length);
    assert.ok((await readFile(l.path)).equals(img.layers[i]!.bytes), `layer ${i} bytes`);
    assert.is((await stat(l.path)).mode & 0o777, 0o444, 'stored read-only');
  }
}

test.after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => {});
  await rm(work, { recursive: true, force: true });
});

// ---- pure parts ---------------------------------------------------------------------------------

test('parseImageReference: Docker Hub defaults, hosts with ports, digests, and refusals', () => {
  const node = parseImageReference('node:22');
  assert.equal(node, { registry: 'registry-1.docker.io', repository: 'library/node', tag: '22', canonical: 'docker.io/library/node:22' });
  assert.is(parseImageReference('ubuntu').tag, 'latest');
  assert.is(parseImageReference('user/app').repository, 'user/app');
  assert.is(parseImageReference('docker.io/node').repository, 'library/node');
  assert.is(parseImageReference('index.docker.io/library/node:20').registry, 'registry-1.docker.io');
  const local = parseImageReference('localhost:5000/a/b:t');
  assert.equal(local, { registry: 'localhost:5000', repository: 'a/b', tag: 't', canonical: 'localhost:5000/a/b:t' });
  const reg = parseImageReference('registry.example:5000/name:tag');
  assert.is(reg.registry, 'registry.example:5000');
  assert.is(reg.repository, 'name');
  const hex = 'a'.repeat(64);
  const pinned = parseImageReference(`name@sha256:${hex}`);
  assert.is(pinned.digest, `sha256:${hex}`);
  assert.is(pinned.tag, undefined, 'a digest alone implies no tag');
  assert.is(pinned.canonical, `docker.io/library/name@sha256:${hex}`);
  assert.is(parseImageReference(`h.io/n:t@sha256:${hex}`).canonical, `h.io/n:t@sha256:${hex}`);
  for (const bad of ['', 'UPPER', 'a:b:c', 'name@sha256:abc', 'name:', 'a//b', ' node', 'node:tag with space', 'na$me']) {
    assert.throws(() => parseImageReference(bad), (e: unknown) => e instanceof TorporError && e.code === 'INVALID_ARGUMENT', bad);
  }
});

test('parseImageConfig: the fields torpor uses, absent ones empty, wrong ones IMAGE_INVALID', () => {
  const c = parseImageConfig({ architecture: 'amd64', os: 'linux', config: { Env: ['A=1'], WorkingDir: '/w', User: '1000:1000', Entrypoint: ['/e'], Cmd: ['x', 'y'] } });
  assert.equal(c, { architecture: 'amd64', os: 'linux', env: ['A=1'], workingDir: '/w', user: '1000:1000', entrypoint: ['/e'], cmd: ['x', 'y'] });
  const empty = parseImageConfig(JSON.stringify({ architecture: 'amd64', os: 'linux', config: { Entrypoint: null, Cmd: null } }));
  assert.equal(empty, { architecture: 'amd64', os: 'linux', env: [], workingDir: '', user: '', entrypoint: [], cmd: [] });
  assert.equal(parseImageConfig({ architecture: 'amd64', os: 'linux' }).env, [], 'no config section');
  for (const bad of ['not json', { os: 'linux' }, { architecture: 'amd64', os: 'linux', config: { Cmd: 'sh' } }, { architecture: 'amd64', os: 'linux', config: { Env: ['NOEQUALS'] } }]) {
    assert.throws(() => parseImageConfig(bad), (e: unknown) => e instanceof TorporError && e.code === 'IMAGE_INVALID');
  }
});

test('WWW-Authenticate challenges: Bearer parameters (quoted commas too) and Basic', () => {
  const [b] = parseChallenges('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/node:pull,push"');
  assert.equal(b, { scheme: 'bearer', params: { realm: 'https://auth.docker.io/token', service: 'registry.docker.io', scope: 'repository:library/node:pull,push' } });
  assert.equal(parseChallenges('Basic realm="x"'), [{ scheme: 'basic', params: { realm: 'x' } }]);
});

test('credentials from DOCKER_CONFIG: the auth form, identitytoken, Docker Hub names; credsStore does not fail', async () => {
  const dir = join(work, 'creds');
  await mkdir(dir, { recursive: true });
  await writeFile(
    join(dir, 'config.json'),
    JSON.stringify({
      credsStore: 'desktop',
      credHelpers: { 'gcr.io': 'gcloud' },
      auths: {
        'https://index.docker.io/v1/': { auth: Buffer.from('hubuser:hub:pass').toString('base64') },
        'reg.example:5000': { auth: Buffer.from('u:p').toString('base64'), identitytoken: 'refresh-me' },
        'gcr.io': {},
      },
    }),
  );
  const env = { DOCKER_CONFIG: dir };
  assert.equal(await loadCredentials('registry-1.docker.io', env), { username: 'hubuser', password: 'hub:pass' });
  assert.equal(await loadCredentials('reg.example:5000', env), { username: 'u', password: 'p', identityToken: 'refresh-me' });
  assert.is(await loadCredentials('gcr.io', env), null, 'a helper-only entry reads as no credentials');
  assert.is(await loadCredentials('other.example', env), null);
  assert.is(await loadCredentials('x', { HOME: join(work, 'nowhere') }), null, 'no config.json at all');
});

test('a registry nobody listens on: REGISTRY_UNREACHABLE naming it', async () => {
  const port = await freePort();
  const err = await code(pullImage(`127.0.0.1:${port}/x:y`, { home: await newHome(), env: noCreds }));
  assert.is(err.code, 'REGISTRY_UNREACHABLE');
  assert.match(err.message, `127.0.0.1:${port}`);
});

// ---- the registry ---------------------------------------------------------------------------

registryTest('pull by tag and by digest: config, verified read-only layers, manifest digest', async () => {
  const { push } = await plainRegistry();
  const l = await base();
  const img = makeImage([l.base, l.app], { env: ['PATH=/bin', 'NODE_ENV=production'], cmd: ['node', 'main.js'] });
  await push.image('demo/app', 'v1', img);
  const home = await newHome();
  const events: ImageProgress[] = [];
  const pulled = await pullImage(`${push.host}/demo/app:v1`, { home, env: noCreds, onProgress: (p) => events.push(p) });
  assert.is(pulled.manifestDigest, img.manifest.digest);
  assert.is(pulled.configDigest, img.config.digest);
  assert.equal(pulled.config.env, ['PATH=/bin', 'NODE_ENV=production']);
  assert.equal(pulled.config.cmd, ['node', 'main.js']);
  assert.is(pulled.source, `${push.host}/demo/app:v1`);
  await checkLayers(pulled, img);
  assert.ok(pulled.layers[0]!.path.startsWith(blobDir(home)));
  const downloads = events.filter((e) => e.phase === 'download');
  assert.ok(downloads.some((e) => e.phase === 'download' && e.digest === l.app.digest && e.bytes === l.app.bytes.length && !e.cached));
  // The manifest and config are kept by digest too.
  assert.ok((await readFile(join(blobDir(home), img.manifest.digest.slice(7)))).equals(img.manifest.bytes));
  assert.ok((await readFile(join(blobDir(home), img.config.digest.slice(7)))).equals(img.config.bytes));

  const byDigest = await fetchImage({ image: `${push.host}/demo/app@${img.manifest.digest}` }, { home: await newHome(), env: noCreds });
  assert.is(byDigest.configDigest, img.config.digest);
  await checkLayers(byDigest, img);
});

registryTest('a manifest list with linux/arm64 and linux/amd64 resolves to amd64; arm64 alone is IMAGE_PLATFORM', async () => {
  const { push } = await plainRegistry();
  const l = await base();
  const arm = makeImage([await gzLayer({ arm: 'arm' })], { architecture: 'arm64' });
  const amd = makeImage([l.base], { architecture: 'amd64' });
  const list = makeIndex([{ image: arm, architecture: 'arm64' }, { image: amd, architecture: 'amd64' }], true);
  await push.index('multi/app', 'both', [arm, amd], list);
  const home = await newHome();
  const pulled = await pullImage(`${push.host}/multi/app:both`, { home, env: noCreds });
  assert.is(pulled.manifestDigest, amd.manifest.digest, 'the amd64 manifest');
  assert.is(pulled.configDigest, amd.config.digest);
  await checkLayers(pulled, amd);
  assert.ok(!(await readdir(blobDir(home))).includes(arm.layers[0]!.digest.slice(7)), 'nothing of the arm64 image downloaded');

  const onlyArm = makeIndex([{ image: arm, architecture: 'arm64' }]);
  await push.index('multi/app', 'arm', [arm], onlyArm);
  const err = await code(pullImage(`${push.host}/multi/app:arm`, { home, env: noCreds }));
  assert.is(err.code, 'IMAGE_PLATFORM');
  assert.match(err.message, 'linux/arm64');
  assert.match(err.message, 'multi/app:arm');

  await push.image('multi/app', 'armonly', arm);
  const cfg = await code(pullImage(`${push.host}/multi/app:armonly`, { home, env: noCreds }));
  assert.is(cfg.code, 'IMAGE_PLATFORM', 'a plain manifest whose config says arm64');
  assert.match(cfg.message, 'linux/arm64');
});

registryTest('unknown tag or repository: IMAGE_NOT_FOUND naming the reference; unknown layer type: IMAGE_INVALID', async () => {
  const { push } = await plainRegistry();
  await push.image('nf/app', 'v1', makeImage([(await base()).base]));
  const home = await newHome();
  for (const ref of [`${push.host}/nf/app:nosuchtag`, `${push.host}/nosuch/repo:v1`]) {
    const err = await code(pullImage(ref, { home, env: noCreds }));
    assert.is(err.code, 'IMAGE_NOT_FOUND', ref);
    assert.match(err.message, ref);
  }
  const odd = blob('application/vnd.example.layer.v1+weird', Buffer.from('weird'));
  await push.image('nf/odd', 'v1', makeImage([odd]));
  const err = await code(pullImage(`${push.host}/nf/odd:v1`, { home, env: noCreds }));
  assert.is(err.code, 'IMAGE_INVALID');
  assert.match(err.message, 'application/vnd.example.layer.v1+weird');
});

registryTest('a blob served with wrong bytes: BLOB_CORRUPT naming digest and image, nothing kept; a clean pull after', async () => {
  const { reg, push } = await plainRegistry();
  const layer = await gzLayer({ 'data.bin': randomBytes(200_000) });
  const img = makeImage([layer]);
  await push.image('corrupt/app', 'v1', img);
  const data = reg.blobData(layer.digest);
  const good = await readFile(data);
  const bad = Buffer.from(good);
  bad[bad.length >> 1] = bad[bad.length >> 1]! ^ 0xff;
  await writeFile(data, bad);
  const home = await newHome();
  const ref = `${push.host}/corrupt/app:v1`;
  const err = await code(pullImage(ref, { home, env: noCreds }));
  assert.is(err.code, 'BLOB_CORRUPT');
  assert.match(err.message, layer.digest);
  assert.match(err.message, 'corrupt/app:v1');
  const left = (await readdir(blobDir(home))).filter((n) => n.startsWith(layer.digest.slice(7)));
  assert.equal(left, [], 'neither the blob nor a partial file of it');
  // Short, too: the registry's file cut in half.
  await writeFile(data, good.subarray(0, good.length >> 1));
  assert.is((await code(pullImage(ref, { home, env: noCreds }))).code, 'BLOB_CORRUPT');
  assert.equal((await readdir(blobDir(home))).filter((n) => n.startsWith(layer.digest.slice(7))), []);

  await writeFile(data, good);
  await checkLayers(await pullImage(ref, { home, env: noCreds }), img);
});

registryTest('an interrupted download resumes with a Range request; a second pull downloads nothing', async () => {
  const { reg, push } = await plainRegistry();
  const layer = blob('application/vnd.oci.image.layer.v1.tar', await makeTar({ 'big.bin': randomBytes(1 << 20) }));
  const img = makeImage([layer]);
  await push.image('resume/app', 'v1', img);
  const proxy = await startProxy(reg.host);
  cleanups.push(proxy.stop);
  const home = await newHome();
  await mkdir(blobDir(home), { recursive: true });
  const half = layer.bytes.length >> 1;
  await writeFile(join(blobDir(home), `${layer.digest.slice(7)}.partial`), layer.bytes.subarray(0, half));
  const events: ImageProgress[] = [];
  const ref = `${proxy.host}/resume/app:v1`;
  await checkLayers(await pullImage(ref, { home, env: noCreds, onProgress: (p) => events.push(p) }), img);
  const gets = proxy.log.filter((r) => r.path.endsWith(`/blobs/${layer.digest}`));
  assert.is(gets.length, 1);
  assert.is(gets[0]!.range, `bytes=${half}-`);
  assert.is(gets[0]!.status, 206);
  const first = events.find((e) => e.phase === 'download' && e.digest === layer.digest);
  assert.equal(first, { phase: 'download', digest: layer.digest, bytes: half, total: layer.bytes.length, cached: false });
  assert.equal((await readdir(blobDir(home))).filter((n) => n.includes('.partial')), [], 'no partial left');

  proxy.log.length = 0;
  events.length = 0;
  await checkLayers(await pullImage(ref, { home, env: noCreds, onProgress: (p) => events.push(p) }), img);
  assert.equal(proxy.log.filter((r) => r.path.includes('/blobs/')), [], 'no blob requests on the second pull');
  assert.ok(events.some((e) => e.phase === 'download' && e.digest === layer.digest && e.cached));

  // A registry that answers the range request with the whole blob (200): the download starts over.
  const noRanges = await newHome();
  await mkdir(blobDir(noRanges), { recursive: true });
  await writeFile(join(blobDir(noRanges), `${layer.digest.slice(7)}.partial`), layer.bytes.subarray(0, half));
  proxy.log.length = 0;
  proxy.ignoreRange.on = true;
  await checkLayers(await pullImage(ref, { home: noRanges, env: noCreds }), img);
  proxy.ignoreRange.on = false;
  const whole = proxy.log.filter((r) => r.path.endsWith(`/blobs/${layer.digest}`));
  assert.equal(whole.map((r) => [r.range, r.status]), [[`bytes=${half}-`, 200]]);

  // A partial that is not a prefix of the blob (a different blob's bytes) fails its check and is
  // removed; the retry after it starts clean.
  const other = await newHome();
  await mkdir(blobDir(other), { recursive: true });
  await writeFile(join(blobDir(other), `${layer.digest.slice(7)}.partial`), randomBytes(half));
  assert.is((await code(pullImage(ref, { home: other, env: noCreds }))).code, 'BLOB_CORRUPT');
  await checkLayers(await pullImage(ref, { home: other, env: noCreds }), img);
});

registryTest('a connection dropped mid-blob: REGISTRY_UNREACHABLE, the bytes kept, the next pull resumes from them', async () => {
  const { reg, push } = await plainRegistry();
  const layer = blob('application/vnd.oci.image.layer.v1.tar', await makeTar({ 'big.bin': randomBytes(3 << 20) }));
  const img = makeImage([layer]);
  await push.image('dropped/app', 'v1', img);
  const proxy = await startProxy(reg.host);
  cleanups.push(proxy.stop);
  proxy.cut.digest = layer.digest;
  proxy.cut.after = 1 << 20;
  const home = await newHome();
  const ref = `${proxy.host}/dropped/app:v1`;
  const err = await code(pullImage(ref, { home, env: noCreds }));
  assert.is(err.code, 'REGISTRY_UNREACHABLE');
  assert.match(err.message, layer.digest);
  const partial = join(blobDir(home), `${layer.digest.slice(7)}.partial`);
  const kept = (await stat(partial)).size;
  assert.ok(kept > 0 && kept <= 1 << 20, `${kept} bytes kept`);
  await checkLayers(await pullImage(ref, { home, env: noCreds }), img);
  const gets = proxy.log.filter((r) => r.path.endsWith(`/blobs/${layer.digest}`));
  assert.is(gets.length, 2);
  assert.is(gets[1]!.range, `bytes=${kept}-`);
});

registryTest('an aborted pull rejects with the signal reason', async () => {
  const { push } = await plainRegistry();
  await push.image('abort/app', 'v1', makeImage([(await base()).base]));
  const ac = new AbortController();
  ac.abort(new Error('stop now'));
  try {
    await pullImage(`${push.host}/abort/app:v1`, { home: await newHome(), env: noCreds, signal: ac.signal });
    assert.unreachable('should have been aborted');
  } catch (err) {
    assert.is((err as Error).message, 'stop now');
  }
});

registryTest('two images on one base layer share its blob file', async () => {
  const { push } = await plainRegistry();
  const l = await base();
  const a = makeImage([l.base, await gzLayer({ a: 'a' })]);
  const b = makeImage([l.base, await gzLayer({ b: 'b' })]);
  await push.image('share/a', 'v1', a);
  await push.image('share/b', 'v1', b);
  const home = await newHome();
  const events: ImageProgress[] = [];
  const pa = await pullImage(`${push.host}/share/a:v1`, { home, env: noCreds });
  const pb = await pullImage(`${push.host}/share/b:v1`, { home, env: noCreds, onProgress: (p) => events.push(p) });
  assert.is(pa.layers[0]!.path, pb.layers[0]!.path);
  assert.is((await stat(pa.layers[0]!.path)).nlink, 1, 'one file');
  assert.ok(events.some((e) => e.phase === 'download' && e.digest === l.base.digest && e.cached), 'the base came from the cache');
});

registryTest('two processes pulling one image into one home at once both succeed with intact blobs; pull time', async () => {
  const { push } = await plainRegistry();
  const layer = blob('application/vnd.oci.image.layer.v1.tar', await makeTar({ 'rand.bin': randomBytes(24 << 20) }));
  const img = makeImage([layer]);
  await push.image('concurrent/app', 'v1', img);
  const home = await newHome();
  const ref = `${push.host}/concurrent/app:v1`;
  const registryModule = pathToFileURL(join(import.meta.dirname, '..', 'lib', 'image', 'registry.ts')).href;
  const script = `const { pullImage } = await import(${JSON.stringify(registryModule)});
const t = performance.now();
const p = await pullImage(${JSON.stringify(ref)}, { home: ${JSON.stringify(home)}, env: { HOME: '/nonexistent' } });
console.log(JSON.stringify({ ms: performance.now() - t, digest: p.layers[0].digest }));`;
  const run = () =>
    new Promise<{ status: number | null; out: string }>((ok) => {
      const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d));
      child.on('exit', (status) => ok({ status, out }));
    });
  const results = await Promise.all([run(), run()]);
  for (const r of results) assert.is(r.status, 0, r.out);
  await checkLayers(await pullImage(ref, { home, env: noCreds, verify: true }), img);
  assert.equal((await readdir(blobDir(home))).filter((n) => n.includes('.partial') || n.startsWith('tmp.')), []);

  // One process alone into a fresh home: the figure the commit quotes.
  const alone = await newHome();
  const t = performance.now();
  await pullImage(ref, { home: alone, env: noCreds });
  const ms = performance.now() - t;
  const mb = layer.bytes.length / 1e6;
  console.log(`  pull of ${mb.toFixed(1)} MB from the local registry: ${ms.toFixed(0)} ms (${(mb / (ms / 1000)).toFixed(0)} MB/s)`);
});

// ---- authentication -------------------------------------------------------------------------

basicAuthTest('htpasswd registry: credentials from DOCKER_CONFIG pull; a wrong password or none is REGISTRY_AUTH', async () => {
  const dir = join(work, 'basic-registry');
  await mkdir(dir, { recursive: true });
  makeHtpasswd(join(dir, 'htpasswd'), 'alice', 'wonderland');
  const reg = await startRegistry(dir, { htpasswd: join(dir, 'htpasswd') });
  cleanups.push(() => reg.stop());
  const basicAuth = 'Basic ' + Buffer.from('alice:wonderland').toString('base64');
  const push = new Pusher(reg.host, async () => basicAuth);
  const img = makeImage([(await base()).base]);
  await push.image('private/app', 'v1', img);
  const ref = `${reg.host}/private/app:v1`;
  const good = { DOCKER_CONFIG: await dockerConfig(join(work, 'dc-basic-good'), { [reg.host]: { user: 'alice', password: 'wonderland' } }) };
  const bad = { DOCKER_CONFIG: await dockerConfig(join(work, 'dc-basic-bad'), { [reg.host]: { user: 'alice', password: 'nope' } }) };
  await checkLayers(await pullImage(ref, { home: await newHome(), env: good }), img);
  const wrong = await code(pullImage(ref, { home: await newHome(), env: bad }));
  assert.is(wrong.code, 'REGISTRY_AUTH');
  assert.match(wrong.message, reg.host);
  const none = await code(pullImage(ref, { home: await newHome(), env: noCreds }));
  assert.is(none.code, 'REGISTRY_AUTH');
  assert.match(none.message, reg.host);
});

tokenAuthTest('token registry: a Bearer token from the realm with credentials, anonymous pull where granted, a wrong password is REGISTRY_AUTH', async () => {
  const dir = join(work, 'token-registry');
  await mkdir(dir, { recursive: true });
  const { key, cert } = makeCertificate(dir);
  const tokens = await startTokenServer(await readFile(key, 'utf8'), await readFile(cert, 'utf8'), { bob: 'builder' }, true);
  cleanups.push(tokens.stop);
  const reg = await startRegistry(dir, { token: { realm: tokens.realm, service: tokens.service, issuer: tokens.issuer, rootCertBundle: cert } });
  cleanups.push(() => reg.stop());
  const push = new Pusher(reg.host, async (repo) => {
    const res = await fetch(`${tokens.realm}?service=${tokens.service}&scope=repository:${repo}:pull,push`, {
      headers: { authorization: 'Basic ' + Buffer.from('bob:builder').toString('base64') },
    });
    return `Bearer ${((await res.json()) as { token: string }).token}`;
  });
  const img = makeImage([(await base()).base, await gzLayer({ t: 'token' })]);
  await push.image('tok/app', 'v1', img);
  const ref = `${reg.host}/tok/app:v1`;

  tokens.log.length = 0;
  const good = { DOCKER_CONFIG: await dockerConfig(join(work, 'dc-token-good'), { [reg.host]: { user: 'bob', password: 'builder' } }) };
  await checkLayers(await pullImage(ref, { home: await newHome(), env: good }), img);
  assert.ok(tokens.log.some((r) => r.user === 'bob' && r.granted && r.scope === 'repository:tok/app:pull'), JSON.stringify(tokens.log));
  assert.is(tokens.log.length, 1, 'one token, cached for the scope, served every request of the pull');

  tokens.log.length = 0;
  await checkLayers(await pullImage(ref, { home: await newHome(), env: noCreds }), img);
  assert.ok(tokens.log.some((r) => r.user === '' && r.granted), 'anonymous token');

  const bad = { DOCKER_CONFIG: await dockerConfig(join(work, 'dc-token-bad'), { [reg.host]: { user: 'bob', password: 'wrong' } }) };
  const err = await code(pullImage(ref, { home: await newHome(), env: bad }));
  assert.is(err.code, 'REGISTRY_AUTH');
  assert.match(err.message, reg.host);
});

// ---- local sources -----------------------------------------------------------------------------

/** Writes an OCI layout of the given blobs with index.json entries `refs`. */
async function writeOciLayout(dir: string, blobs: { digest: string; bytes: Buffer }[], refs: object[]): Promise<void> {
  await mkdir(join(dir, 'blobs', 'sha256'), { recursive: true });
  await writeFile(join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  for (const b of blobs) await writeFile(join(dir, 'blobs', 'sha256', b.digest.slice(7)), b.bytes);
  await writeFile(join(dir, 'index.json'), JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: refs }));
}

function desc(b: { digest: string; bytes: Buffer; mediaType: string }, extra: object = {}): object {
  return { mediaType: b.mediaType, digest: b.digest, size: b.bytes.length, ...extra };
}

const allBlobs = (img: TestImage) => [img.manifest, img.config, ...img.layers];

test('fromOciLayout: one manifest; one by ref name among several; a nested index; a damaged blob is IMAGE_INVALID', async () => {
  const l = await base();
  const one = makeImage([l.base, l.app]);
  const two = makeImage([l.base], { cmd: ['two'] });
  const arm = makeImage([await gzLayer({ arm: '1' })], { architecture: 'arm64' });
  const nested = makeIndex([{ image: arm, architecture: 'arm64' }, { image: two, architecture: 'amd64' }]);

  const single = join(work, 'oci-single');
  await writeOciLayout(single, allBlobs(one), [desc(one.manifest)]);
  const home = await newHome();
  const p1 = await fromOciLayout(single, { home });
  assert.is(p1.manifestDigest, one.manifest.digest);
  assert.is(p1.configDigest, one.config.digest);
  assert.is(p1.source, `oci-layout:${single}`);
  await checkLayers(p1, one);

  const multi = join(work, 'oci-multi');
  const ref = (n: string) => ({ annotations: { 'org.opencontainers.image.ref.name': n } });
  await writeOciLayout(multi, [...allBlobs(one), ...allBlobs(two), ...allBlobs(arm), nested], [desc(one.manifest, ref('one')), desc(nested, ref('two'))]);
  const p2 = await fetchImage({ ociLayout: multi, tag: 'two' }, { home });
  assert.is(p2.manifestDigest, two.manifest.digest, 'the index named "two" resolved to its amd64 manifest');
  assert.equal(p2.config.cmd, ['two']);
  assert.is((await fromOciLayout(multi, { home, tag: 'one' })).configDigest, one.config.digest);
  const ambiguous = await code(fromOciLayout(multi, { home }));
  assert.is(ambiguous.code, 'IMAGE_INVALID');
  assert.match(ambiguous.message, multi);
  assert.is((await code(fromOciLayout(multi, { home, tag: 'three' }))).code, 'IMAGE_INVALID');

  const damaged = join(work, 'oci-damaged');
  const layer = await gzLayer({ fresh: randomBytes(1000) });
  const d = makeImage([layer]);
  await writeOciLayout(damaged, allBlobs(d), [desc(d.manifest)]);
  const lp = join(damaged, 'blobs', 'sha256', layer.digest.slice(7));
  const bytes = await readFile(lp);
  bytes[10] = bytes[10]! ^ 1;
  await writeFile(lp, bytes);
  const err = await code(fromOciLayout(damaged, { home: await newHome() }));
  assert.is(err.code, 'IMAGE_INVALID');
  assert.match(err.message, damaged);
  assert.match(err.message, layer.digest);
  assert.is((await code(fromOciLayout(join(work, 'no-such-layout'), { home }))).code, 'IMAGE_INVALID');
});

/** A docker-save archive: the legacy layout (<id>/layer.tar, a symlinked shared layer) or docker 25's blobs/ one. */
async function writeDockerArchive(file: string, layout: 'legacy' | 'blobs', layers: Buffer[], configDoc: object): Promise<{ config: Buffer; layerDigests: string[] }> {
  const config = Buffer.from(JSON.stringify(configDoc));
  const files: Record<string, string | Buffer> = {};
  let layerPaths: string[];
  let configPath: string;
  if (layout === 'legacy') {
    layerPaths = layers.map((_, i) => `layer${i}/layer.tar`);
    layers.forEach((l, i) => (files[`layer${i}/layer.tar`] = l));
    configPath = `${sha256(config).slice(7)}.json`;
  } else {
    layerPaths = layers.map((l) => `blobs/sha256/${sha256(l).slice(7)}`);
    layers.forEach((l) => (files[`blobs/sha256/${sha256(l).slice(7)}`] = l));
    configPath = `blobs/sha256/${sha256(config).slice(7)}`;
  }
  files[configPath] = config;
  const manifest = [{ Config: configPath, RepoTags: ['demo/archive:v1'], Layers: layerPaths }];
  // manifest.json last, as docker writes it: the reader must not depend on the order.
  const tarBytes = await makeTar({ ...files, 'manifest.json': JSON.stringify(manifest) });
  await writeFile(file, tarBytes);
  return { config, layerDigests: layers.map(sha256) };
}

test('fromDockerArchive: legacy and blobs/ layouts, digests computed, a shared layer as a symlink; not an archive is IMAGE_INVALID', async () => {
  const l0 = await makeTar({ 'etc/hostname': 'archive\n' });
  const l1 = await makeTar({ 'app/x': 'x'.repeat(5000) });
  const cfg = { architecture: 'amd64', os: 'linux', config: { Env: ['A=b'], Cmd: ['x'] }, rootfs: { type: 'layers', diff_ids: [sha256(l0), sha256(l1)] } };
  for (const layout of ['legacy', 'blobs'] as const) {
    const file = join(work, `archive-${layout}.tar`);
    const { config, layerDigests } = await writeDockerArchive(file, layout, [l0, l1], cfg);
    const home = await newHome();
    const p = await fetchImage({ dockerArchive: file }, { home });
    assert.is(p.configDigest, sha256(config), layout);
    assert.equal(p.layers.map((x) => x.digest), layerDigests);
    assert.equal(p.layers.map((x) => x.mediaType), ['application/vnd.oci.image.layer.v1.tar', 'application/vnd.oci.image.layer.v1.tar']);
    assert.ok((await readFile(p.layers[1]!.path)).equals(l1));
    assert.equal(p.config.env, ['A=b']);
    assert.ok((await readFile(join(blobDir(home), p.manifestDigest.slice(7)))).length > 0, 'a manifest kept for it');
    assert.is(p.source, `docker-archive:${file}`);
  }

  // docker save of two images sharing a layer writes it once and symlinks the other.
  const dir = join(work, 'archive-links');
  await mkdir(join(dir, 'aaa'), { recursive: true });
  await mkdir(join(dir, 'bbb'), { recursive: true });
  const config = Buffer.from(JSON.stringify({ ...cfg, config: {} }));
  await writeFile(join(dir, 'aaa', 'layer.tar'), l0);
  await symlink('../aaa/layer.tar', join(dir, 'bbb', 'layer.tar'));
  await writeFile(join(dir, `${sha256(config).slice(7)}.json`), config);
  await writeFile(join(dir, 'manifest.json'), JSON.stringify([{ Config: `${sha256(config).slice(7)}.json`, RepoTags: null, Layers: ['bbb/layer.tar'] }]));
  const linked = join(work, 'archive-links.tar');
  const r = spawnSync('tar', ['-C', dir, '-cf', linked, '.'], { encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  const p = await fromDockerArchive(linked, { home: await newHome() });
  assert.equal(p.layers.map((x) => x.digest), [sha256(l0)]);

  const notTar = join(work, 'not-an-archive.tar');
  await writeFile(notTar, 'hello, this is not a tar file at all'.repeat(30));
  const err = await code(fromDockerArchive(notTar, { home: await newHome() }));
  assert.is(err.code, 'IMAGE_INVALID');
  assert.match(err.message, notTar);
  const arm = join(work, 'archive-arm.tar');
  await writeDockerArchive(arm, 'blobs', [l0], { ...cfg, architecture: 'arm64' });
  assert.is((await code(fromDockerArchive(arm, { home: await newHome() }))).code, 'IMAGE_PLATFORM');
});

skopeoTest('skopeo copies from the test registry to oci: and docker-archive:, and both read back as the same image', async () => {
  const { push } = await plainRegistry();
  const l = await base();
  const img = makeImage([l.base, l.app], { cmd: ['skopeo'] });
  await push.image('skopeo/app', 'v1', img);
  const oci = join(work, 'skopeo-oci');
  const archive = join(work, 'skopeo.tar');
  const src = `docker://${push.host}/skopeo/app:v1`;
  for (const dest of [`oci:${oci}:v1`, `docker-archive:${archive}:skopeo/app:v1`]) {
    const r = spawnSync('skopeo', ['--insecure-policy', 'copy', '--src-tls-verify=false', src, dest], { encoding: 'utf8' });
    assert.is(r.status, 0, r.stderr);
  }
  const fromOci = await fromOciLayout(oci, { home: await newHome(), tag: 'v1' });
  assert.is(fromOci.configDigest, img.config.digest);
  await checkLayers(fromOci, img);
  const fromArchive = await fromDockerArchive(archive, { home: await newHome() });
  assert.equal(fromArchive.config.cmd, ['skopeo']);
  // docker-archive holds the layers uncompressed: their contents are the gunzipped registry layers.
  for (const [i, layer] of fromArchive.layers.entries()) {
    assert.ok((await readFile(layer.path)).equals(gunzipSync(img.layers[i]!.bytes)), `layer ${i}`);
  }
});

test.run();
