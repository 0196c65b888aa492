// Templates from a container image with a real Linux guest (lib/template, lib/image): the post's
// flow end to end. A "node" image assembled from Debian's nodejs and npm packages (an OCI layout
// in the store, built on the host: test/image-fixtures/node-image.ts) becomes a template with a
// step; a sandbox from it runs `node --version`, clones a repository from a git server on the
// host, `npm install`s against a verdaccio registry on the host (both started here, reached
// through `network: { allowHostLoopback: true }`), is paused, and is continued in another
// process where `npm test` passes. Also: the image's config applies, diskMb is the free space
// asked, a template built on a template shares its layers, remove is refused while used.
// Runs where a Linux guest can boot (hardware host, or the nested host of `npm run test:linux`).
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { homeLayout } from '../lib/store/home.js';
import { Template, type TemplateInfo } from '../lib/template/template.js';
import { makeProjectRepo, PROJECT_TEST_OUTPUT, startGitServer, type GitServer } from './fixtures/git-server.js';
import { guestUrl, LEFT_PAD, publishPackage, startNpmRegistry, writeLeftPad, type NpmRegistry } from './fixtures/npm-registry.js';
import { ensureNodeImage, nodeImageSkipReason } from './image-fixtures/node-image.js';
import { privateHome, realStore } from './sandbox-home.js';
import { testUnless } from './skip-unless.js';
import { nodeArgs } from './child-node.js';

const FILE = 'template-linux';
const support = await linuxGuestSupport();
const noImage = support.ok ? await nodeImageSkipReason(realStore) : null;
const linuxTest = testUnless(FILE, support.ok ? null : `this host cannot boot a Linux guest: ${support.reason}`, 'linux-guest');
const imageTest = support.ok && noImage ? testUnless(FILE, noImage, 'tools') : linuxTest;

/** Emulated CPUs in the nested host: boots and restores take seconds. */
const BOOT = 240_000;
const CONNECT = { restoreTimeoutMs: 120_000, bootTimeoutMs: 240_000 };
const RES = { cpu: 1, memoryMb: 512, diskMb: 2048 };

const home = privateHome(test, 'torpor-template-linux-');
let layout = '';
let registry: NpmRegistry | undefined;
let git: GitServer | undefined;
let scratch = '';
let node: TemplateInfo | undefined;

// Started by the first test that needs them (a failure in uvu's before hook would be swallowed).
let started: Promise<void> | undefined;
function fixtures(): Promise<void> {
  started ??= (async () => {
    layout = (await ensureNodeImage(realStore, { onProgress: (l: string) => console.log(`  node image: ${l}`) })).dir;
    scratch = await mkdtemp(join(tmpdir(), 'torpor-template-linux-'));
    registry = await startNpmRegistry();
    const pkg = join(scratch, 'left-pad');
    await writeLeftPad(pkg);
    await publishPackage(registry.url, pkg);
    git = await startGitServer({ repoDir: await makeProjectRepo(join(scratch, 'repos')) });
  })();
  return started;
}

test.after(async () => {
  await git?.close().catch(() => undefined);
  await registry?.close().catch(() => undefined);
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

imageTest('a template from the node image: config applied, a step captured, diskMb free; node --version in a sandbox from it', async () => {
  await fixtures();
  const phases: string[] = [];
  const t0 = performance.now();
  node = await Template.build({
    name: 'node',
    from: { ociLayout: layout },
    // The first step as root (it writes /etc); the second as the image's user, `node`.
    steps: [{ run: 'node --version > /etc/node-version-at-build', user: 'root' }, { run: 'npm config set fund false && id -un > ~/.built-by' }],
    env: { TORPOR_TEMPLATE: 'node' },
    resources: RES,
    bootTimeoutMs: BOOT,
    onProgress: (p) => {
      if (!phases.includes(p.phase)) phases.push(p.phase);
    },
  });
  console.log(`  template-linux: node template built in ${((performance.now() - t0) / 1000).toFixed(1)} s (emulated host); ${JSON.stringify(node.timings)}; phases ${phases.join(',')}`);
  assert.is(node.kind, 'user');
  assert.equal(node.resources, RES);
  assert.ok(node.image?.configDigest.startsWith('sha256:'));
  assert.ok(phases.includes('boot') && phases.includes('step') && phases.includes('capture'), phases.join(','));

  const sbx = await Sandbox.create({ template: 'node', resources: { cpu: 1, memoryMb: 512 } });
  try {
    const info = await sbx.getInfo();
    assert.is(info.createdFrom, 'template', `created from ${info.createdFrom}: ${info.bootReason}`);
    assert.equal(info.resources, RES);
    const v = await sbx.commands.run('node --version');
    assert.match(v.stdout, /^v\d+\.\d+\.\d+\n$/);
    // The step's effect is in the template's disk.
    assert.is((await sbx.commands.run('cat /etc/node-version-at-build')).stdout, v.stdout);
    assert.is((await sbx.commands.run('cat ~/.built-by')).stdout, 'node\n');
    // The image's config and the template's env: the image's User is `node` (uid 1000), its
    // WorkingDir /home/node; PATH comes from the image's Env.
    const who = await sbx.commands.run('echo "$(id -un) $(id -u) $(pwd) $TORPOR_TEMPLATE"; echo "$PATH"');
    const [first, path] = who.stdout.split('\n');
    assert.is(first, 'node 1000 /home/node node');
    assert.match(path!, /\/usr\/bin/);
    // A command's own user wins.
    assert.is((await sbx.commands.run('id -u', { user: 'root' })).stdout, '0\n');
    // diskMb: the root file system has the size asked, at least 1 GiB of it free.
    const df = await sbx.commands.run("df -m / | awk 'NR==2 { print $2, $4 }'");
    const [size, avail] = df.stdout.trim().split(' ').map(Number);
    assert.ok(size! >= RES.diskMb - 128 && size! <= RES.diskMb, `df: ${df.stdout}`);
    assert.ok(avail! >= 1024, `df: ${df.stdout}`);
  } finally {
    await sbx.kill();
  }
});

imageTest("the post's flow: git clone from the host, npm install from a registry on the host, pause, connect from another process, npm test", async () => {
  await fixtures();
  assert.ok(node, 'the node template was built by the test before');
  const sbx = await Sandbox.create({ template: 'node', resources: { cpu: 1, memoryMb: 512 }, network: { allowHostLoopback: true } });
  let id = sbx.sandboxId;
  try {
    const clone = await sbx.commands.run(`git clone ${guestUrl(git!.url)} project`, { timeoutMs: 180_000 });
    assert.is(clone.exitCode, 0);
    const install = await sbx.commands.run(`npm install --registry ${guestUrl(registry!.url)} --no-audit --no-fund`, { cwd: '/home/node/project', timeoutMs: 300_000 });
    assert.is(install.exitCode, 0, install.stderr);
    const ls = await sbx.commands.run(`cat node_modules/${LEFT_PAD.name}/package.json`, { cwd: '/home/node/project' });
    assert.match(ls.stdout, new RegExp(`"version": "${LEFT_PAD.version.replaceAll('.', '\\.')}"`));
    // A process left running across the pause and the other process's connect.
    await sbx.commands.run('echo $$ > /tmp/watch.pid; exec sleep 100000', { background: true });
    await sbx.commands.run('for i in $(seq 100); do [ -s /tmp/watch.pid ] && break; sleep 0.1; done; kill -0 $(cat /tmp/watch.pid)');
    const p = await sbx.pause();
    const info = await Sandbox.getInfo(id);
    console.log(`  template-linux: after npm install, the pause wrote ${(p.bytes / 1048576).toFixed(1)} MiB; ${(info.bytesOnDisk / 1048576).toFixed(1)} MiB on disk beyond the template`);
    const r = spawnSync(process.execPath, nodeArgs('test/fixtures/template-connect-child.ts', 'npm-test', id, '/home/node/project'), {
      encoding: 'utf8',
      timeout: 400_000,
      env: { ...process.env, TORPOR_HOME: home },
    });
    assert.is(r.status, 0, r.stderr);
    const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { exitCode: number; stdout: string; stderr: string; alive: string; resumedFrom: string; resumeReason: string | null };
    assert.is(out.resumedFrom, 'memory', `resumed from ${out.resumedFrom}: ${out.resumeReason}`);
    assert.is(out.exitCode, 0, out.stderr);
    assert.ok(out.stdout.includes(PROJECT_TEST_OUTPUT), out.stdout);
    assert.is(out.alive, 'alive', 'the process started before the pause still runs');
    id = '';
  } finally {
    if (id) await (await Sandbox.connect(id, CONNECT).catch(() => undefined))?.kill().catch(() => undefined);
  }
});

imageTest('a template built on a template shares its layers; remove is refused while a sandbox uses it, and then goes', async () => {
  assert.ok(node);
  const child = await Template.build({ name: 'node-app', from: 'node', steps: [{ run: 'echo app > /opt/marker', user: 'root' }], bootTimeoutMs: BOOT });
  const childRecord = JSON.parse(await (await import('node:fs/promises')).readFile(join(homeLayout(home).templates, 'node-app', 'template.json'), 'utf8')) as { build: { diskLayers: string[] } };
  const parentRecord = JSON.parse(await (await import('node:fs/promises')).readFile(join(homeLayout(home).templates, 'node', 'template.json'), 'utf8')) as { build: { diskLayers: string[] } };
  assert.equal(childRecord.build.diskLayers.slice(0, parentRecord.build.diskLayers.length), parentRecord.build.diskLayers, "the child's disk starts with the parent's layers");
  assert.equal(child.resources, RES, 'resources come from the parent');
  // A second template from the same image, no steps: no new boot, no copy; it is the image's
  // automatic template (the same build directory the node template's layers start from).
  const bare = await Template.build({ name: 'node-bare', from: { ociLayout: layout }, resources: RES });
  assert.ok(bare.timings!.boot! < 5_000 && bare.timings!.unpack! < 5_000, `a second build of the same image reuses its root filesystem and template: ${JSON.stringify(bare.timings)}`);
  const bareRecord = JSON.parse(await (await import('node:fs/promises')).readFile(join(homeLayout(home).templates, 'node-bare', 'template.json'), 'utf8')) as { build: { dir: string; diskLayers: string[] } };
  assert.ok(bareRecord.build.dir.includes('/templates/image-'), bareRecord.build.dir);
  assert.equal(parentRecord.build.diskLayers.slice(0, bareRecord.build.diskLayers.length), bareRecord.build.diskLayers, 'node is built on the same image template');
  await Template.remove('node-bare');
  const sbx = await Sandbox.create({ template: 'node-app', resources: { cpu: 1, memoryMb: 512 } });
  try {
    assert.is((await sbx.commands.run('cat /opt/marker; cat /etc/node-version-at-build | head -c 1')).stdout, 'app\nv');
    const err = await Template.remove('node').catch((e: unknown) => e);
    assert.ok(err instanceof TorporError && err.code === 'TEMPLATE_IN_USE', String(err));
    assert.match((err as Error).message, /template:node-app/);
    const listed = await Template.list();
    assert.equal(listed.filter((t) => t.kind === 'user').map((t) => t.name), ['node', 'node-app']);
    assert.ok(listed.find((t) => t.name === 'node-app')!.dependents.includes(sbx.sandboxId));
    assert.ok(listed.some((t) => t.kind === 'automatic' && t.name.startsWith('image-')), 'the image\'s automatic template is listed');
  } finally {
    await sbx.kill();
  }
  await Template.remove('node-app');
  await Template.remove('node');
  assert.equal((await Template.list()).filter((t) => t.kind === 'user'), []);
});

linuxTest('another size than the template\'s boots its disk: the files of its steps are there', async () => {
  // A small template from base (no image needed) for the disk boot path.
  await Template.build({ name: 'base-step', from: 'base', steps: [{ run: 'echo from-step > /opt/step' , user: 'root' }], resources: { cpu: 1, memoryMb: 256 }, bootTimeoutMs: BOOT });
  const sbx = await Sandbox.create({ template: 'base-step', resources: { cpu: 1, memoryMb: 384 }, boot: { timeoutMs: BOOT } });
  try {
    const info = await sbx.getInfo();
    assert.is(info.createdFrom, 'boot');
    assert.match(info.bootReason ?? '', /memoryMb 384/);
    assert.is((await sbx.commands.run('cat /opt/step')).stdout, 'from-step\n');
  } finally {
    await sbx.kill();
  }
  const same = await Sandbox.create({ template: 'base-step', resources: { cpu: 1, memoryMb: 256 } });
  try {
    assert.is((await same.getInfo()).createdFrom, 'template');
    assert.is((await same.commands.run('cat /opt/step')).stdout, 'from-step\n');
  } finally {
    await same.kill();
  }
});

linuxTest('a larger diskMb than the template\'s grows the disk warm: df shows it, a file larger than the template\'s disk fits, pause + connect keep both; Template.build grows too', async () => {
  await Template.build({ name: 'base-grow', from: 'base', steps: [{ run: 'echo grown > /opt/grow', user: 'root' }], resources: { cpu: 1, memoryMb: 256 }, bootTimeoutMs: BOOT });
  const templateMb = (await Template.get('base-grow')).resources.diskMb;
  // Twice the template's disk and more: a file as large as the template's whole disk fits only if it grew.
  const want = 2 * templateMb + 512;
  const bigMb = templateMb + 256;
  const dfMb = async (s: Sandbox) => Number((await s.commands.run("df -m / | awk 'NR==2 { print $2 }'")).stdout.trim());
  const sbx = await Sandbox.create({ template: 'base-grow', resources: { cpu: 1, memoryMb: 256, diskMb: want }, boot: { timeoutMs: BOOT } });
  let id = '';
  try {
    id = sbx.sandboxId;
    const info = await sbx.getInfo();
    assert.is(info.createdFrom, 'template', `warm, not booted: ${info.bootReason ?? ''}`);
    assert.is(info.resources.diskMb, want);
    const size = await dfMb(sbx);
    assert.ok(size >= want - 160 && size <= want, `df -m /: ${size} MiB, asked ${want}`);
    assert.is((await sbx.commands.run('cat /opt/grow')).stdout, 'grown\n');
    await sbx.commands.run(`fallocate -l ${bigMb}M /var/tmp/big || dd if=/dev/zero of=/var/tmp/big bs=1M count=${bigMb} status=none`, { user: 'root' });
    assert.is((await sbx.commands.run('stat -c %s /var/tmp/big')).stdout.trim(), String(bigMb * 1048576));
    await sbx.pause();
  } catch (err) {
    await sbx.kill().catch(() => undefined);
    throw err;
  }
  const back = await Sandbox.connect(id, CONNECT);
  try {
    assert.is((await back.getInfo()).resources.diskMb, want);
    const size = await dfMb(back);
    assert.ok(size >= want - 160 && size <= want, `after connect, df -m /: ${size} MiB`);
    assert.is((await back.commands.run('stat -c %s /var/tmp/big')).stdout.trim(), String(bigMb * 1048576));
    // Still writable past the template's end after the restore of its own generation.
    await back.commands.run('echo after > /var/tmp/after && sync', { user: 'root' });
    assert.is((await back.commands.run('cat /var/tmp/after')).stdout, 'after\n');
  } finally {
    await back.kill();
  }

  // Template.build: a smaller disk than the parent's is refused, a larger one is grown before the steps.
  const smaller = await Template.build({ name: 'base-shrunk', from: 'base-grow', resources: { cpu: 1, memoryMb: 256, diskMb: templateMb - 64 } }).catch((e) => e);
  assert.ok(smaller instanceof TorporError && smaller.code === 'INVALID_ARGUMENT' && /shrink/.test(smaller.message), String(smaller));
  const grown = await Template.build({ name: 'base-grown', from: 'base-grow', steps: [{ run: 'df -m / > /opt/df-in-build', user: 'root' }], resources: { cpu: 1, memoryMb: 256, diskMb: want }, bootTimeoutMs: BOOT });
  assert.is(grown.resources.diskMb, want);
  const fromGrown = await Sandbox.create({ template: 'base-grown', resources: { cpu: 1, memoryMb: 256 }, boot: { timeoutMs: BOOT } });
  try {
    assert.is((await fromGrown.getInfo()).createdFrom, 'template');
    assert.is((await fromGrown.getInfo()).resources.diskMb, want);
    const size = await dfMb(fromGrown);
    assert.ok(size >= want - 160 && size <= want, `a sandbox of the grown template: df -m /: ${size} MiB`);
    const inBuild = Number((await fromGrown.commands.run("awk 'NR==2 { print $2 }' /opt/df-in-build")).stdout.trim());
    assert.is(inBuild, size, 'the steps saw the grown filesystem');
    assert.is((await fromGrown.commands.run('cat /opt/grow')).stdout, 'grown\n');
  } finally {
    await fromGrown.kill();
  }
});

test.run();
