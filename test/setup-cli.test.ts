// `torpor setup` and friends through the real command line: a second run with
// nothing to do finishes in under a second and rebuilds nothing; --json shape.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, copyFile, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { packageRoot } from '../lib/setup/paths.js';
import { streamProgress } from '../lib/setup/progress.js';
import { missingPackages, requireTools } from '../lib/setup/tools.js';
import { homeLayout } from '../lib/store/home.js';
import { needsRootAnd, needsSetup, testUnless } from './skip-unless.js';

const bin = join(packageRoot, 'bin', 'torpor.js');
/** Tests that run `torpor setup` to the end: only where nothing stops it (tools, root). */
const setupTest = testUnless('setup-cli', await needsSetup(), 'artifacts');

function torpor(args: string[], env: NodeJS.ProcessEnv = {}) {
  const started = process.hrtime.bigint();
  const r = spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env: { ...process.env, ...env } });
  return { ...r, ms: Number(process.hrtime.bigint() - started) / 1e6 };
}

test('torpor --help and an unknown command', () => {
  const help = torpor(['--help']);
  assert.is(help.status, 0);
  assert.match(help.stdout, /^usage: torpor <command>/);
  assert.match(help.stdout, /setup \[--kernel PATH \| --own-kernel\] \[--base-image REF \| --debian-base\] \[--json\] \[--verify\]\n\s+\[--install-deps \[--dry-run\]\]/);
  assert.match(help.stdout, /--kernel PATH/);
  const none = torpor([]);
  assert.is(none.status, 2);
  assert.is(none.stdout, '');
  assert.match(none.stderr, /^usage: torpor <command>/);
  const bad = torpor(['frobnicate']);
  assert.is(bad.status, 2);
  assert.match(bad.stderr, /unknown command 'frobnicate'/);
  const badFlag = torpor(['setup', '--frobnicate']);
  assert.is(badFlag.status, 2);
  assert.match(badFlag.stderr, /INVALID_ARGUMENT/);
});

test('progress: plain lines per phase (percent, bytes, elapsed); a TTY rewrites one status line', () => {
  const sink = (tty: boolean) => {
    const writes: string[] = [];
    const stream = { isTTY: tty, columns: 80, write: (s: string) => (writes.push(s), true) } as unknown as NodeJS.WriteStream;
    return { writes, progress: streamProgress(stream, 10_000) };
  };
  const plain = sink(false);
  plain.progress({ phase: 'kernel', status: 'start', message: 'building Linux', elapsedMs: 0 });
  plain.progress({ phase: 'kernel', status: 'step', percent: 12.5, message: 'compile', elapsedMs: 61_000 });
  plain.progress({ phase: 'kernel', status: 'step', percent: 13, message: 'compile', elapsedMs: 62_000 }); // throttled
  plain.progress({ phase: 'rootfs', status: 'step', bytes: 3 << 20, message: 'mkfs.ext4', elapsedMs: 1500 });
  plain.progress({ phase: 'kernel', status: 'done', elapsedMs: 300_000 });
  assert.equal(plain.writes, [
    'kernel: starting building Linux (0.0 s)\n',
    'kernel: 12% compile (61.0 s)\n',
    'rootfs: 3.0 MiB mkfs.ext4 (1.5 s)\n',
    'kernel: done (300.0 s)\n',
  ]);
  const tty = sink(true);
  tty.progress({ phase: 'kernel', status: 'step', percent: 50, message: 'compile', elapsedMs: 1000 });
  tty.progress({ phase: 'kernel', status: 'done', elapsedMs: 2000 });
  assert.equal(tty.writes, ['\r\x1b[Kkernel: 50% compile (1.0 s)', '\r\x1b[K', 'kernel: done (2.0 s)\n']);
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

setupTest('setup --json twice: the second run rebuilds nothing and hashes nothing', async () => {
  const first = torpor(['setup', '--json']);
  assert.is(first.status, 0, first.stderr);
  const paths = JSON.parse(first.stdout) as Record<string, string>;
  assert.equal(Object.keys(paths).sort(), ['agent', 'baseSource', 'built', 'fetched', 'host', 'kernel', 'kernelOrigin', 'rootfs', 'seconds', 'sources']);
  assert.ok(paths.host === 'hardware' || paths.host === 'pvm');
  const mtimes = await Promise.all([paths.kernel!, paths.rootfs!, paths.agent!].map(async (p) => (await stat(p)).mtimeMs));

  const second = torpor(['setup', '--json']);
  assert.is(second.status, 0, second.stderr);
  // The first run may have built or fetched (a cold store, when this file runs alone): the rest is the same.
  const { seconds: _first, built: _built, fetched: _fetched, ...same } = paths;
  const { seconds: _second, built, fetched, ...again } = JSON.parse(second.stdout) as Record<string, string>;
  assert.equal(again, same);
  assert.equal([built, fetched], [[], []], 'nothing built or fetched the second time');
  for (const phase of ['agent', 'kernel', 'rootfs']) assert.match(second.stderr, new RegExp(`${phase}: up to date`));
  assert.not.match(second.stderr, /starting/);
  const after = await Promise.all([paths.kernel!, paths.rootfs!, paths.agent!].map(async (p) => (await stat(p)).mtimeMs));
  assert.equal(after, mtimes, 'no artifact was rewritten');
  console.log(`  second setup run: ${second.ms.toFixed(0)} ms (node start included)`);
  // Nothing rebuilt is asserted above by the artifacts' mtimes; the time only guards against a
  // hashing pass (seconds per artifact). The 1 s goal is not a unit-test bound: on a loaded
  // 2-core host (CI builds L1's kernel beside npm test) node's start alone took ~1 s.
  assert.ok(second.ms < 5000, `second run took ${second.ms.toFixed(0)} ms`);

  if (paths.host === 'pvm') assert.match(second.stderr, /note: .*PVM host.*TORPOR_KERNEL/);

  // Human output names each artifact; --verify hashes everything and still rebuilds nothing.
  const verify = torpor(['setup', '--verify']);
  assert.is(verify.status, 0, verify.stderr);
  assert.match(verify.stdout, /setup: nothing to build/);
  assert.match(verify.stdout, new RegExp(`kernel  ${paths.kernel!.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
});

setupTest('setup --kernel PATH: checked, stored by content, remembered for later runs', async () => {
  const first = torpor(['setup', '--json']);
  assert.is(first.status, 0, first.stderr);
  const ours = JSON.parse(first.stdout) as Record<string, string>;
  // A fresh home whose artifacts are the shared store's: the choice is recorded
  // in this home's setup.json only, and nothing needs rebuilding.
  const home = await mkdtemp(join(tmpdir(), 'torpor-setup-kernel-'));
  try {
    await symlink(homeLayout().artifacts, join(home, 'artifacts'));
    const supplied = join(home, 'my-vmlinux');
    await copyFile(ours.kernel!, supplied);
    const r = torpor(['setup', '--kernel', supplied, '--json'], { TORPOR_HOME: home });
    assert.is(r.status, 0, r.stderr);
    const paths = JSON.parse(r.stdout) as Record<string, string>;
    assert.match(paths.kernel!, /\/artifacts\/kernel-supplied\/[0-9a-f]+\/vmlinux$/);
    assert.is(paths.rootfs!.slice(home.length), ours.rootfs!.slice(homeLayout().root.length), 'the shared image, not rebuilt');
    assert.match(r.stderr, /kernel: .*\(supplied, elf-pvh\)/);
    assert.not.match(r.stderr, /note: .*PVM host/, 'a supplied kernel is what a PVM host needs');
    const record = JSON.parse(await readFile(join(home, 'setup.json'), 'utf8')) as { kernel: { source: string; format: string } };
    assert.is(record.kernel.source, supplied);
    assert.is(record.kernel.format, 'elf-pvh');

    // Remembered: a plain run uses it, even after the source file is gone (the store has a copy).
    await rm(supplied);
    const again = torpor(['setup', '--json'], { TORPOR_HOME: home });
    assert.is(again.status, 0, again.stderr);
    assert.is((JSON.parse(again.stdout) as Record<string, string>).kernel, paths.kernel);
    assert.match(again.stderr, /kernel: up to date .*\(supplied, elf-pvh\)/);

    // TORPOR_KERNEL overrides the recorded choice for one run, and is checked too.
    const bad = torpor(['setup'], { TORPOR_HOME: home, TORPOR_KERNEL: '/etc/hostname' });
    assert.is(bad.status, 1);
    assert.match(bad.stderr, /KERNEL_INVALID: \/etc\/hostname is not a kernel/);

    // --own-kernel forgets the choice: back to torpor's kernel.
    const own = torpor(['setup', '--own-kernel', '--json'], { TORPOR_HOME: home });
    assert.is(own.status, 0, own.stderr);
    assert.is((JSON.parse(own.stdout) as Record<string, string>).kernel!.slice(home.length), ours.kernel!.slice(homeLayout().root.length));
    assert.not.ok('kernel' in (JSON.parse(await readFile(join(home, 'setup.json'), 'utf8')) as object));
  } finally {
    await rm(home, { recursive: true, force: true });
  }
});

setupTest('a damaged setup.json is ignored, not trusted: setup still runs on its stored artifacts', async () => {
  const first = torpor(['setup', '--json']);
  assert.is(first.status, 0, first.stderr);
  const home = await mkdtemp(join(tmpdir(), 'torpor-setup-record-'));
  try {
    await symlink(homeLayout().artifacts, join(home, 'artifacts'));
    for (const text of ['null', '[1]', '{"kernel":null}', '{"kernel":{"source":42}}', '{"kernel":{"source":"/x","sha256":"../../etc","format":"elf-pvh"}}', '{trunc']) {
      await writeFile(join(home, 'setup.json'), text);
      const r = torpor(['setup', '--json'], { TORPOR_HOME: home });
      assert.is(r.status, 0, `${text}: ${r.stderr}`);
      assert.is((JSON.parse(r.stdout) as Record<string, string>).kernel!.slice(home.length), (JSON.parse(first.stdout) as Record<string, string>).kernel!.slice(homeLayout().root.length));
    }
  } finally {
    await rm(home, { recursive: true, force: true });
  }
});

testUnless('setup-cli', needsRootAnd('setpriv'), 'root')('a non-root user who would need to build the image is told so before anything builds', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-setup-nonroot-'));
  try {
    await chmod(dir, 0o777);
    const started = Date.now();
    const r = spawnSync(
      'setpriv',
      ['--reuid', '65534', '--regid', '65534', '--clear-groups', process.execPath, bin, 'setup'],
      { encoding: 'utf8', env: { ...process.env, HOME: dir, TORPOR_HOME: join(dir, 'home') } },
    );
    assert.is(r.status, 1, r.stderr);
    assert.match(r.stderr, /PERMISSION_DENIED: building the root filesystem needs root/);
    // The advice builds into this user's TORPOR_HOME (plain sudo would use root's home) and hands it back.
    assert.ok(r.stderr.includes(`sudo env TORPOR_HOME=${join(dir, 'home')} npx torpor setup && sudo chown -R`), r.stderr);
    assert.ok(Date.now() - started < 10_000, 'refused up front, not after a kernel build');
    assert.equal(await readdir(join(dir, 'home', 'artifacts')), []);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

testUnless('setup-cli', needsRootAnd('setpriv'), 'root')('everything that stops setup is in one message, in a stable order: missing tools, then missing root', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-setup-blockers-'));
  try {
    await chmod(dir, 0o777);
    // PATH names nothing: every tool is missing (but the sbin directories setup always searches).
    const env: NodeJS.ProcessEnv = { ...process.env, PATH: '/nonexistent', HOME: dir, TORPOR_HOME: join(dir, 'home') };
    delete env.TORPOR_AGENT;
    delete env.TORPOR_KERNEL;
    const setpriv = spawnSync('sh', ['-c', 'command -v setpriv'], { encoding: 'utf8' }).stdout.trim();
    const r = spawnSync(setpriv, ['--reuid', '65534', '--regid', '65534', '--clear-groups', process.execPath, bin, 'setup'], { encoding: 'utf8', env });
    assert.is(r.status, 1, r.stderr);
    const packages = missingPackages(['agent', 'kernel', 'rootfs'], { PATH: '/nonexistent' }).join(' ');
    const home = join(dir, 'home');
    assert.is(
      r.stderr,
      'torpor: MISSING_TOOLS: setup cannot start on this host, for 2 reasons: ' +
        '(1) MISSING_TOOLS: torpor setup needs host tools that are not installed (for: agent, kernel, rootfs). ' +
        `Install them with: apt-get install ${packages} (or: torpor setup --install-deps) ` +
        '(2) PERMISSION_DENIED: building the root filesystem needs root (mmdebstrap creates files owned by root; ' +
        'mkfs.ext4 -d copies ownership as found). Build it once as root into this TORPOR_HOME, then take it back: ' +
        `sudo env TORPOR_HOME=${home} npx torpor setup && sudo chown -R "$(id -u):$(id -g)" ${home} ` +
        "(plain `sudo npx torpor setup` would build into root's own home instead). Later runs as you reuse the image. " +
        'Or, without root: TORPOR_BASE_IMAGE=<an image reference, pinned by digest> makes the base from a container image.\n',
    );
    assert.equal(await readdir(join(home, 'artifacts')), [], 'nothing was built');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

testUnless('setup-cli', needsRootAnd('setpriv'), 'root')('a TORPOR_HOME the user cannot write: one line saying what to do, exit 1, no stack trace', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-setup-readonly-'));
  try {
    await chmod(dir, 0o755); // root's, not nobody's
    const r = spawnSync('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', process.execPath, bin, 'setup', '--json'], {
      encoding: 'utf8',
      env: { ...process.env, HOME: '/nonexistent', TORPOR_HOME: join(dir, 'home') },
    });
    assert.is(r.status, 1, r.stderr);
    assert.is(r.stdout, '');
    assert.match(r.stderr, /^torpor: .*(EACCES|PERMISSION_DENIED).*TORPOR_HOME to a directory you own/);
    assert.not.match(r.stderr, /\n\s+at /, 'no stack trace');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('doctor reports the host', () => {
  const r = torpor(['doctor']);
  assert.match(r.stdout, /TORPOR_HOME: /);
  assert.match(r.stdout, /pvm|hardware|PVM|hardware virtualization/i);
});

test.run();
