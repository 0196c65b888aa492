// The fixtures of the container-image template tests, checked on the host (no KVM): the local
// npm registry (verdaccio, offline) takes a published package, the git server (git
// http-backend over smart HTTP) serves the project repository, and the host's git and npm clone
// it, install its dependency from the registry and run its test, as the guest will in the
// end-to-end test. Then the node image layout (test/image-fixtures/node-image.ts): built into
// the store when this host can (root, mmdebstrap), or found there; its digests, sizes and media
// types checked, and its layers holding node, npm, git and the `node` user.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { makeProjectRepo, PROJECT_TEST_OUTPUT, startGitServer, type GitServer } from './fixtures/git-server.js';
import { guestUrl, LEFT_PAD, npmEnv, npmIsolation, publishPackage, startNpmRegistry, writeLeftPad, type NpmRegistry } from './fixtures/npm-registry.js';
import { checkOciLayout, ensureNodeImage, layerEntries, NODE_IMAGE_PATH, NODE_IMAGE_REF, nodeImageArtifactDir, nodeImageSkipReason } from './image-fixtures/node-image.js';
import { needsRootAnd, testUnless } from './skip-unless.js';
import { realStore } from './sandbox-home.js';

const run = promisify(execFile);

/** GET `url` with another Host header (fetch may not set it): what the registry answers a guest. */
function getWithHost(url: URL, host: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { headers: { host } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => (res.statusCode === 200 ? resolve(body) : reject(new Error(`GET ${url}: ${res.statusCode}`))));
    });
    req.on('error', reject);
  });
}
const FILE = 'test/image-fixtures.test.ts';

test('guestUrl maps the host loopback to the sandbox gateway', () => {
  assert.is(guestUrl('http://127.0.0.1:4873/'), 'http://10.0.2.2:4873/');
  assert.is(guestUrl('http://127.0.0.1:9/project.git'), 'http://10.0.2.2:9/project.git');
  assert.throws(() => guestUrl('http://example.com/'));
});

interface Servers {
  scratch: string;
  registry: NpmRegistry;
  git: GitServer;
  publishMs: number;
}

/** The registry with torpor-left-pad published and the git server with the project: what the guest will use. */
async function withServers(fn: (s: Servers) => Promise<void>): Promise<void> {
  const scratch = await mkdtemp(join(tmpdir(), 'torpor-image-fixtures-'));
  const registry = await startNpmRegistry();
  let git: GitServer | undefined;
  try {
    const pkg = join(scratch, 'left-pad');
    await mkdir(pkg);
    await writeLeftPad(pkg);
    const t = Date.now();
    await publishPackage(registry.url, pkg);
    const publishMs = Date.now() - t;
    git = await startGitServer({ repoDir: await makeProjectRepo(join(scratch, 'repos')) });
    await fn({ scratch, registry, git, publishMs });
  } finally {
    await git?.close();
    await registry.close();
    await rm(scratch, { recursive: true, force: true });
  }
}

test('npm registry + git server: clone, npm install from the local registry, npm test', async () => {
  await withServers(async ({ scratch, registry, git, publishMs }) => {
    // Offline: a package nobody published is a 404, not a trip to npmjs.org.
    const missing = await fetch(new URL('left-pad', registry.url));
    assert.is(missing.status, 404, 'no uplinks: unknown packages are not proxied');

    const packument = (await (await fetch(new URL(LEFT_PAD.name, registry.url))).json()) as {
      versions: Record<string, { dist: { tarball: string } }>;
    };
    const tarball = packument.versions[LEFT_PAD.version]?.dist.tarball ?? '';
    assert.ok(tarball.startsWith(registry.url), `tarball URL on the registry's own address: ${tarball}`);
    // The guest asks with Host: 10.0.2.2:<port>; verdaccio answers with tarball URLs it can reach.
    const asGuest = JSON.parse(await getWithHost(new URL(LEFT_PAD.name, registry.url), `10.0.2.2:${registry.port}`)) as typeof packument;
    assert.ok(asGuest.versions[LEFT_PAD.version]?.dist.tarball.startsWith(`http://10.0.2.2:${registry.port}/`));

    const clone = join(scratch, 'clone');
    let t = Date.now();
    // Protocol v2 (git's default since 2.26) and v0 both go through http-backend.
    await run('git', ['-c', 'protocol.version=2', 'clone', '-q', git.url, clone], { env: { ...process.env, GIT_TERMINAL_PROMPT: '0' } });
    const cloneMs = Date.now() - t;
    await run('git', ['-c', 'protocol.version=0', 'clone', '-q', git.url, join(scratch, 'clone-v0')], { env: { ...process.env, GIT_TERMINAL_PROMPT: '0' } });
    const head = (await run('git', ['-C', clone, 'log', '-1', '--format=%s'])).stdout.trim();
    assert.is(head, 'torpor test project');
    // Not a dumb server: the smart protocol's advertisement.
    const adv = await fetch(`${git.url}/info/refs?service=git-upload-pack`);
    assert.is(adv.headers.get('content-type'), 'application/x-git-upload-pack-advertisement');
    // Push is refused (receive-pack is off over HTTP without an authenticated user).
    const push = await fetch(`${git.url}/info/refs?service=git-receive-pack`);
    assert.is.not(push.status, 200);

    t = Date.now();
    await run('npm', ['install', '--registry', registry.url, ...npmIsolation(scratch)], { cwd: clone, env: npmEnv(), timeout: 120_000 });
    const installMs = Date.now() - t;
    const installed = JSON.parse(await readFile(join(clone, 'node_modules', LEFT_PAD.name, 'package.json'), 'utf8')) as { version: string };
    assert.is(installed.version, LEFT_PAD.version);
    const out = await run('npm', ['test', '--silent'], { cwd: clone, env: npmEnv() });
    assert.ok(out.stdout.includes(PROJECT_TEST_OUTPUT), out.stdout);
    console.log(`image-fixtures: publish ${publishMs} ms, git clone ${cloneMs} ms, npm install ${installMs} ms`);
  });
});

// The node image: minutes to build (mmdebstrap, root; ~3.5 min on 2 cores), then found in the
// store in seconds. TORPOR_TEST_NODE_IMAGE=0 skips building it (a stored one is still checked).
const cached = existsSync(join(await nodeImageArtifactDir(realStore), 'manifest.json'));
const skip = cached
  ? null
  : process.env.TORPOR_TEST_NODE_IMAGE === '0'
    ? 'the node image is not in the store and TORPOR_TEST_NODE_IMAGE=0 says not to build it'
    : await nodeImageSkipReason(realStore);
const imageCategory = skip === null ? 'host' : skip.includes('root') ? 'root' : skip.includes('TORPOR_TEST') ? 'artifacts' : 'tools';
const imageTest = testUnless(FILE, skip, imageCategory);

imageTest('node image layout: digests, sizes, media types, config; node, npm, git and the node user in its layers', async () => {
  const t = Date.now();
  const image = await ensureNodeImage(realStore, { onProgress: (line) => process.stderr.write(`node image: ${line}\n`) });
  const layout = await checkOciLayout(image.dir);
  assert.is(layout.ref, NODE_IMAGE_REF);
  assert.is(layout.config.architecture, 'amd64');
  assert.is(layout.config.os, 'linux');
  assert.is(layout.config.config.User, 'node');
  assert.is(layout.config.config.WorkingDir, '/home/node');
  assert.ok(layout.config.config.Env.some((e) => e.startsWith('PATH=/usr/local/sbin:')));
  assert.is(layout.layers.length, 2);
  assert.is(layout.layers[0]!.mediaType, 'application/vnd.oci.image.layer.v1.tar');
  assert.is(layout.layers[1]!.mediaType, 'application/vnd.oci.image.layer.v1.tar+gzip');

  const base = await layerEntries(image.dir, layout.layers[0]!);
  const top = await layerEntries(image.dir, layout.layers[1]!);
  assert.ok(base.has('usr/bin/bash'), 'the base layer is a Debian root filesystem');
  assert.ok(!base.has('usr/bin/node'), 'node comes in the second layer');
  assert.ok(top.has('usr/bin/node') || top.has('usr/bin/nodejs'), 'the second layer has node');
  assert.ok(top.has('usr/bin/git'));
  assert.ok(top.has('usr/bin/npm') || top.has('usr/share/nodejs/npm/bin/npm-cli.js'));
  assert.ok(top.has('etc/ssl/certs/ca-certificates.crt'));
  // A whiteout: the base layer's marker file is deleted by the second.
  assert.ok(base.has('etc/torpor-fixture/base-only'));
  assert.ok(top.has('etc/torpor-fixture/.wh.base-only'), 'the second layer whites out a base file');
  assert.is(base.get('home/node')?.uid, 1000);
  console.log(`image-fixtures: node image ${image.built ? 'built' : 'from the store'} in ${((Date.now() - t) / 1000).toFixed(1)} s at ${image.dir}`);
});

// What the end-to-end test does in a sandbox, done here in a chroot of the image's flattened
// layers (root: chroot, mknod; the host's network namespace, so the servers are at 127.0.0.1):
// the image's own node, git and npm, as its user `node`, against the fixture servers.
const chrootTest = testUnless(FILE, skip ?? needsRootAnd('chroot', 'mknod', 'tar'), skip ? imageCategory : 'root');

chrootTest("the node image works: in a chroot of its layers, as user node, node --version, git clone, npm install, npm test", async () => {
  const image = await ensureNodeImage(realStore);
  const layout = await checkOciLayout(image.dir);
  await withServers(async ({ scratch, registry, git }) => {
    const root = join(scratch, 'rootfs');
    await mkdir(root);
    let t = Date.now();
    // Flatten: each layer in order, then the whiteouts (each deletes what lower layers had).
    for (const layer of layout.layers) {
      const blob = join(image.dir, 'blobs', 'sha256', layer.digest.slice(7));
      const gz = layer.mediaType.endsWith('+gzip');
      await run('tar', ['-x', ...(gz ? ['-z'] : []), '-f', blob, '-C', root, '--numeric-owner', '--same-permissions']);
      const { stdout } = await run('find', [root, '-name', '.wh.*']);
      for (const wh of stdout.split('\n').filter(Boolean)) {
        await rm(join(wh, '..', wh.slice(wh.lastIndexOf('/.wh.') + 5)), { recursive: true, force: true });
        await rm(wh);
      }
    }
    const flattenMs = Date.now() - t;
    assert.ok(!existsSync(join(root, 'etc/torpor-fixture/base-only')), 'the whiteout deleted the base file');
    // A container runtime (or the agent) supplies /dev; these four are all the commands need.
    for (const [name, minor] of [['null', 3], ['zero', 5], ['random', 8], ['urandom', 9]] as const) {
      await run('mknod', ['-m', '666', join(root, 'dev', name), 'c', '1', String(minor)]);
    }
    const inImage = (script: string) =>
      run('chroot', ['--userspec=1000:1000', root, '/usr/bin/env', '-i', 'HOME=/home/node', `PATH=${NODE_IMAGE_PATH}`, '/bin/sh', '-ec', `cd /home/node && ${script}`], { timeout: 180_000 });
    const version = (await inImage('node --version')).stdout.trim();
    assert.match(version, /^v\d+\.\d+\.\d+$/);
    t = Date.now();
    await inImage(`git clone -q ${git.url} project`);
    const cloneMs = Date.now() - t;
    t = Date.now();
    await inImage(`cd project && npm install --registry ${registry.url} --no-audit --no-fund --no-update-notifier`);
    const installMs = Date.now() - t;
    const out = (await inImage('cd project && npm test')).stdout;
    assert.ok(out.includes(PROJECT_TEST_OUTPUT), out);
    console.log(`image-fixtures: in the image (chroot): node ${version}, flatten ${flattenMs} ms, git clone ${cloneMs} ms, npm install ${installMs} ms`);
  });
});

test.run();
