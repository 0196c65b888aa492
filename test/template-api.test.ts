// The Template API and `torpor template` on every host: bad options are INVALID_ARGUMENT before
// anything is fetched, booted or written; unknown templates are TEMPLATE_NOT_FOUND; resources'
// two spellings must agree. (Builds themselves boot a guest: test/template-linux.test.ts.)
import { spawnSync } from 'node:child_process';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { Sandbox } from '../lib/sandbox/sandbox.js';
import { diskGrowth } from '../lib/template/build.js';
import { Template } from '../lib/template/template.js';
import { parseImageUser } from '../lib/template/user.js';

const code = (c: string) => (e: unknown) => e instanceof TorporError && e.code === c;
const cli = join(import.meta.dirname, '..', 'bin', 'torpor.js');

async function withHome<T>(fn: (home: string) => Promise<T>): Promise<T> {
  const home = await mkdtemp(join(tmpdir(), 'torpor-template-api-'));
  const saved = process.env.TORPOR_HOME;
  process.env.TORPOR_HOME = home;
  try {
    return await fn(home);
  } finally {
    if (saved === undefined) delete process.env.TORPOR_HOME;
    else process.env.TORPOR_HOME = saved;
    await rm(home, { recursive: true, force: true });
  }
}

test('Template.build: bad options are INVALID_ARGUMENT, nothing written', async () => {
  await withHome(async (home) => {
    const bad: unknown[] = [
      {},
      { name: 'x' },
      { name: 'bad name', from: 'base' },
      { name: 'base', from: 'base' },
      { name: 'image-0123456789abcdef', from: 'base' },
      { name: 'x', from: 'x' },
      { name: 'x', from: { image: '' } },
      { name: 'x', from: { registry: 'node:22' } },
      { name: 'x', from: { image: 'node:22', extra: 1 } },
      { name: 'x', from: 'base', steps: 'echo' },
      { name: 'x', from: 'base', steps: [{ run: '' }] },
      { name: 'x', from: 'base', steps: [{ run: [] }] },
      { name: 'x', from: 'base', steps: [{ copy: { from: '/etc/hosts', to: 'relative' } }] },
      { name: 'x', from: 'base', steps: [{ workdir: 'relative' }] },
      { name: 'x', from: 'base', steps: [{ shell: 'echo' }] },
      { name: 'x', from: 'base', env: { A: 1 } },
      { name: 'x', from: 'base', workdir: 'app' },
      { name: 'x', from: 'base', resources: { cpu: 0 } },
      { name: 'x', from: 'base', resources: { memoryMb: 1 } },
      { name: 'x', from: 'base', resources: { gpus: 1 } },
      { name: 'x', from: 'base', onProgress: 'yes' },
      { name: 'x', from: 'base', bogus: true },
    ];
    for (const opts of bad) {
      const err = await Template.build(opts as never).catch((e) => e);
      assert.ok(code('INVALID_ARGUMENT')(err), `${JSON.stringify(opts)} -> ${err}`);
    }
    assert.equal(await readdir(home), [], 'nothing was created');
  });
});

test('unknown templates: TEMPLATE_NOT_FOUND from get, remove, create and a build from them', async () => {
  await withHome(async () => {
    assert.ok(code('TEMPLATE_NOT_FOUND')(await Template.get('nope').catch((e) => e)));
    assert.ok(code('TEMPLATE_NOT_FOUND')(await Template.remove('nope').catch((e) => e)));
    assert.ok(code('TEMPLATE_NOT_FOUND')(await Sandbox.create({ template: 'nope' }).catch((e) => e)));
    assert.ok(code('INVALID_ARGUMENT')(await Template.remove('base').catch((e) => e)), 'automatic templates are torpor\'s');
    assert.equal(await Template.list(), []);
  });
});

test('Sandbox.create: resources and its aliases must agree; bad resources are INVALID_ARGUMENT', async () => {
  await withHome(async (home) => {
    const bad: unknown[] = [
      { resources: { cpu: 2 }, vcpus: 4 },
      { resources: { memoryMb: 512 }, memoryMiB: 1024 },
      { resources: { cpu: '2' } },
      { resources: { diskMb: 1 } },
      { resources: 'big' },
    ];
    for (const opts of bad) {
      const err = await Sandbox.create(opts as never).catch((e) => e);
      assert.ok(code('INVALID_ARGUMENT')(err), `${JSON.stringify(opts)} -> ${err}`);
    }
    assert.equal(await readdir(home), []);
  });
});

test("Template.build's diskMb against its parent's: larger grows, equal keeps, smaller is INVALID_ARGUMENT (ext4 does not shrink)", () => {
  assert.equal(diskGrowth(undefined, 2048, 'template p'), {});
  assert.equal(diskGrowth(2048, 2048, 'template p'), {});
  assert.equal(diskGrowth(4096, 2048, 'template p'), { growMb: 4096 });
  let err: unknown;
  try {
    diskGrowth(1024, 2048, 'template p');
  } catch (e) {
    err = e;
  }
  assert.ok(code('INVALID_ARGUMENT')(err), String(err));
  assert.match((err as Error).message, /template p's disk \(2048 MiB\).*does not shrink/);
});

test("an image's User as the agent's request fields", () => {
  assert.equal(parseImageUser(''), { uid: 0, gid: 0 });
  assert.equal(parseImageUser('node'), { user: 'node' });
  assert.equal(parseImageUser('1000'), { uid: 1000 });
  assert.equal(parseImageUser('1000:1001'), { uid: 1000, gid: 1001 });
  assert.equal(parseImageUser('node:staff'), { user: 'node' });
});

test('torpor template: usage errors exit 2 and say what is wrong; ls on an empty home lists none', async () => {
  await withHome(async (home) => {
    const run = (...args: string[]) => spawnSync(process.execPath, [cli, 'template', ...args], { encoding: 'utf8', env: { ...process.env, TORPOR_HOME: home } });
    let r = run('build', '--image', 'node:22');
    assert.is(r.status, 2, r.stderr);
    assert.match(r.stderr, /--name/);
    r = run('build', '--name', 'x', '--image', 'a', '--oci-layout', 'b');
    assert.is(r.status, 2, r.stderr);
    r = run('frobnicate');
    assert.is(r.status, 2, r.stderr);
    r = run('rm');
    assert.is(r.status, 2, r.stderr);
    r = run('rm', 'nope');
    assert.is(r.status, 1, r.stderr);
    assert.match(r.stderr, /TEMPLATE_NOT_FOUND/);
    r = run('ls', '--json');
    assert.is(r.status, 0, r.stderr);
    assert.equal(JSON.parse(r.stdout), []);
  });
});

test.run();
