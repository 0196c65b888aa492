// The package as a user installs it: `npm pack` ships what a user needs (dist/, bin/, the
// prebuilt addon, the native sources and binding.gyp for a fallback build, the guest sources
// setup builds from, deps/, docs/) and no build output; installed from the tarball into an
// empty project with no compiler on PATH, it imports and `npx torpor doctor` runs.
//
// Size bound (written down here and in docs/development.md, *The package*): the tarball at most 1.5 MiB, 4 MiB
// unpacked, 500 files. Measured: 0.8 MB packed, 2.3 MB unpacked, 300 files (dist/ and the
// stripped prebuilds/linux-x64/torpor.node, 1 MB, included); before, `"files"` shipped native/
// whole (unit-test and fuzz binaries, object files): 34 MB, 715 files. lib/image/'s ten modules
// (three files each in dist/) took it to 418 files, so the file bound went from 400 to 500: it
// is there to catch build output or tests shipping, which add hundreds, not a few modules.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { packageRoot } from '../lib/setup/paths.js';
import { ensurePackInputs, pack, type PackResult } from './fixtures/pack.js';

const MAX_PACKED = 1.5 * 1024 * 1024;
const MAX_UNPACKED = 4 * 1024 * 1024;
const MAX_FILES = 500;

/** What must never ship: build outputs, tests, fuzzers, benchmarks, the test guest, TypeScript sources (dist/ ships). */
const FORBIDDEN = [
  /(^|\/)out\//,
  /(^|\/)build\//,
  /\.(o|a|so)$/,
  /_test\.(cc|c)$/,
  /^native\/(test|fuzz|bench)\//,
  /^guest\/testvm\//,
  /^guest\/agent\/test\//,
  /^(test|bench|examples|lib|\.ci)\//,
  /node_modules\//,
];

/** The addon's sources, as binding.gyp finds them: a compiler-equipped install can always build from source. */
function addonSources(): string[] {
  const dirs = ['common', 'base', 'addon', 'vmm', 'devices', 'snapshot'].map((d) => `native/${d}`);
  const tracked = execFileSync('git', ['ls-files', ...dirs], { cwd: packageRoot, encoding: 'utf8' }).split('\n');
  return tracked.filter((f) => /\.(cc|h)$/.test(f) && !/_test\.cc$/.test(f));
}

function checkFileList(result: PackResult, required: string[]): void {
  const files = new Set(result.files.map((f) => f.path));
  for (const path of files) {
    for (const bad of FORBIDDEN) assert.not.match(path, bad, `${path} must not ship`);
  }
  for (const path of required) assert.ok(files.has(path), `${path} ships`);
}

const ALWAYS_SHIPPED = [
  'package.json',
  'README.md',
  'binding.gyp',
  'bin/torpor.js',
  'deps/debian-packages.txt',
  'docs/nested.md',
  'guest/kernel/build.sh',
  'guest/kernel/torpor.config',
  'guest/kernel/verify-config.sh',
  'guest/image/build.sh',
  'guest/image/add-agent.sh',
  'guest/agent/Makefile',
  'guest/agent/src/main.c',
  'guest/agent/proto/frame.c',
];

test('npm pack --dry-run: sources for a fallback build and the guest sources ship; no build output, tests or fuzzers', () => {
  const result = pack(['--dry-run']);
  checkFileList(result, [...ALWAYS_SHIPPED, ...addonSources()]);
  assert.ok(result.entryCount <= MAX_FILES, `${result.entryCount} files (bound ${MAX_FILES})`);
  assert.ok(result.size <= MAX_PACKED, `${result.size} bytes packed (bound ${MAX_PACKED})`);
  assert.ok(result.unpackedSize <= MAX_UNPACKED, `${result.unpackedSize} bytes unpacked (bound ${MAX_UNPACKED})`);
});

test('packed, installed into an empty project with no compiler on PATH: it imports, and npx torpor doctor runs', async () => {
  ensurePackInputs();
  const dir = await mkdtemp(join(tmpdir(), 'torpor-package-'));
  try {
    const started = Date.now();
    const result = pack(['--pack-destination', dir]);
    checkFileList(result, ['dist/index.js', 'dist/index.d.ts', 'dist/cli/main.js', 'prebuilds/linux-x64/torpor.node']);
    assert.ok(result.size <= MAX_PACKED, `${result.size} bytes packed (bound ${MAX_PACKED})`);
    console.log(`  package: ${result.entryCount} files, ${(result.size / 1e6).toFixed(2)} MB packed, ${(result.unpackedSize / 1e6).toFixed(2)} MB unpacked`);

    // PATH holds node, npm, npx and sh (npm runs install scripts through it): no cc, g++, make or python3.
    const bin = join(dir, 'bin');
    await mkdir(bin);
    for (const tool of ['node', 'npm', 'npx', 'sh']) {
      const found = spawnSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).stdout.trim();
      assert.ok(found, `${tool} on this host's PATH`);
      await symlink(found, join(bin, tool));
    }
    const env = { HOME: process.env.HOME ?? dir, PATH: bin, npm_config_cache: process.env.npm_config_cache ?? '' };
    if (!env.npm_config_cache) delete (env as Record<string, string>).npm_config_cache;
    const noCompiler = spawnSync('sh', ['-c', 'command -v cc gcc g++ c++ make python3'], { env, encoding: 'utf8' });
    assert.is(noCompiler.stdout, '', 'no compiler on the install PATH');

    const project = join(dir, 'project');
    await mkdir(project);
    await writeFile(join(project, 'package.json'), JSON.stringify({ name: 'probe', version: '1.0.0', private: true, type: 'module' }));
    // --prefer-offline: the dependencies' tarballs are in npm's cache after npm ci, but their
    // registry metadata is not (npm ci reads the lockfile), so a strict --offline cannot resolve them.
    const install = spawnSync('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', join(dir, result.filename)], {
      cwd: project,
      env,
      encoding: 'utf8',
    });
    assert.is(install.status, 0, install.stderr);
    const installed = join(project, 'node_modules', 'torpor');
    assert.not.ok(existsSync(join(installed, 'build')), 'nothing was compiled at install');

    const imported = spawnSync('node', ['--input-type=module', '-e', "import { Sandbox } from 'torpor'; console.log(typeof Sandbox.create);"], {
      cwd: project,
      env,
      encoding: 'utf8',
    });
    assert.is(imported.status, 0, imported.stderr);
    assert.is(imported.stdout, 'function\n');

    const doctor = spawnSync('npx', ['--offline', 'torpor', 'doctor'], { cwd: project, env, encoding: 'utf8' });
    // doctor exits 1 when this host cannot run machines (no /dev/kvm); the addon must load either way.
    if (existsSync('/dev/kvm')) assert.is(doctor.status, 0, doctor.stderr + doctor.stdout);
    assert.not.match(doctor.stdout, /ADDON_LOAD_FAILED/, 'the prebuilt addon loads without a compiler');
    assert.match(doctor.stdout, /^TORPOR_HOME: /m);
    if (existsSync('/dev/kvm')) assert.match(doctor.stdout, /^KVM device: +\/dev\/kvm \(API version 12\)$/m);
    console.log(`  package: pack + install + import + doctor in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test.run();
