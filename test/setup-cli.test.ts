// `torpor setup` and friends through the real command line: a second run with
// nothing to do finishes in under a second and rebuilds nothing; --json shape.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { packageRoot } from '../lib/setup/paths.js';
import { missingPackages, requireTools } from '../lib/setup/tools.js';

const bin = join(packageRoot, 'bin', 'torpor.js');

function torpor(args: string[], env: NodeJS.ProcessEnv = {}) {
  const started = process.hrtime.bigint();
  const r = spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env: { ...process.env, ...env } });
  return { ...r, ms: Number(process.hrtime.bigint() - started) / 1e6 };
}

test('torpor --help and an unknown command', () => {
  const help = torpor(['--help']);
  assert.is(help.status, 0);
  assert.match(help.stdout, /^usage: torpor <command>/);
  assert.match(help.stdout, /setup \[--kernel PATH\] \[--json\] \[--verify\]/);
  assert.match(help.stdout, /--kernel PATH/);
  const bad = torpor(['frobnicate']);
  assert.is(bad.status, 2);
  assert.match(bad.stderr, /unknown command 'frobnicate'/);
  const badFlag = torpor(['setup', '--frobnicate']);
  assert.is(badFlag.status, 2);
  assert.match(badFlag.stderr, /INVALID_ARGUMENT/);
});

test('missing host tools produce one message naming the Debian packages', () => {
  const env = { PATH: '/nonexistent' };
  const missing = missingPackages(['agent', 'kernel', 'rootfs'], env);
  for (const pkg of ['make', 'gcc', 'flex', 'bison', 'bc']) assert.ok(missing.includes(pkg), pkg);
  try {
    requireTools(['kernel', 'rootfs'], env);
    assert.unreachable('no tools on PATH');
  } catch (err) {
    assert.is((err as TorporError).code, 'MISSING_TOOLS');
    assert.match((err as Error).message, /apt-get install .*bison.*flex/);
  }
});

test('setup --kernel with a file that is not a kernel exits non-zero with KERNEL_INVALID', async () => {
  const home = await mkdtemp(join(tmpdir(), 'torpor-setup-test-'));
  try {
    const bogus = join(home, 'bogus');
    await writeFile(bogus, 'hello');
    const r = torpor(['setup', '--kernel', bogus, '--json'], { TORPOR_HOME: home });
    assert.is(r.status, 1);
    assert.match(r.stderr, /KERNEL_INVALID/);
    assert.is(r.stdout, '');
    assert.not.ok(existsSync(join(home, 'setup.json')), 'a refused kernel is not recorded');
  } finally {
    await rm(home, { recursive: true, force: true });
  }
});

test('setup --json twice: the second run rebuilds nothing and takes under a second', async () => {
  const first = torpor(['setup', '--json']);
  if (first.status !== 0 && /PERMISSION_DENIED|MISSING_TOOLS/.test(first.stderr)) {
    console.log(`  skipped: setup cannot complete on this host: ${first.stderr.trim().split('\n').pop()}`);
    return;
  }
  assert.is(first.status, 0, first.stderr);
  const paths = JSON.parse(first.stdout) as Record<string, string>;
  assert.equal(Object.keys(paths).sort(), ['agent', 'host', 'kernel', 'rootfs']);
  assert.ok(paths.host === 'hardware' || paths.host === 'pvm');
  const mtimes = await Promise.all([paths.kernel!, paths.rootfs!, paths.agent!].map(async (p) => (await stat(p)).mtimeMs));

  const second = torpor(['setup', '--json']);
  assert.is(second.status, 0, second.stderr);
  assert.equal(JSON.parse(second.stdout), paths);
  for (const phase of ['agent', 'kernel', 'rootfs']) assert.match(second.stderr, new RegExp(`${phase}: up to date`));
  assert.not.match(second.stderr, /starting/);
  const after = await Promise.all([paths.kernel!, paths.rootfs!, paths.agent!].map(async (p) => (await stat(p)).mtimeMs));
  assert.equal(after, mtimes, 'no artifact was rewritten');
  console.log(`  second setup run: ${second.ms.toFixed(0)} ms (node start included)`);
  assert.ok(second.ms < 1000, `second run took ${second.ms.toFixed(0)} ms`);

  if (paths.host === 'pvm') assert.match(second.stderr, /note: .*PVM host.*TORPOR_KERNEL/);

  // Human output names each artifact; --verify hashes everything and still rebuilds nothing.
  const verify = torpor(['setup', '--verify']);
  assert.is(verify.status, 0, verify.stderr);
  assert.match(verify.stdout, /setup: nothing to build/);
  assert.match(verify.stdout, new RegExp(`kernel  ${paths.kernel!.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
});

test('doctor reports the host', () => {
  const r = torpor(['doctor']);
  assert.match(r.stdout, /TORPOR_HOME: /);
  assert.match(r.stdout, /pvm|hardware|PVM|hardware virtualization/i);
});

test.run();
