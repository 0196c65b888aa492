// The first run as a new user makes it: `npm install torpor` into an empty project by an ordinary
// user (nobody, uid 65534) with no compiler, no make and no python on PATH, from a local npm
// registry this test started (verdaccio on 127.0.0.1, no uplinks: nothing reaches outside this
// machine) holding torpor's tarball, its prebuilt guest package (@torpor/kernel-linux-x64, made
// by scripts/build-kernel-package.ts, which npm installs as torpor's optional dependency; the
// release record in torpor's tarball) and torpor's dependencies as npm's cache kept them from the
// public registry (test/fixtures/npm-cache.ts); `torpor setup` there takes the kernel and agent from the package and makes the base
// root filesystem from a container image pulled from a registry this test started (Debian's
// docker-registry on 127.0.0.1), building nothing; where a Linux guest can run (the nested host
// in CI), Sandbox.create() and a command, as that user. A package whose kernel differs from the
// record is refused (KERNEL_PACKAGE_MISMATCH) and nothing of it is stored.
//
// The base image is made as a release makes it (scripts/build-base-image.ts: the Debian tree of
// guest/image/build.sh as one layer, its digest written to base-image.json) and published with
// skopeo; the record goes into torpor's tarball as kernel-release.json does, so setup takes the
// image as torpor's default with no TORPOR_BASE_IMAGE set.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { chmod, chown, cp, mkdir, mkdtemp, open, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { builtKernelSpec } from '../lib/setup/kernel.js';
import { packageRoot } from '../lib/setup/paths.js';
import { artifactDir, artifactKey } from '../lib/store/artifact.js';
import { baseArtifactDir } from '../lib/setup/rootfs.js';
import { NESTED } from './bounds.js';
import { runtimeTarballs } from './fixtures/npm-cache.js';
import { publishTarball, registryToken, startNpmRegistry, type NpmRegistry } from './fixtures/npm-registry.js';
import { ensurePackInputs, pack } from './fixtures/pack.js';
import { needsPrograms, startRegistry, type TestRegistry } from './image-registry.js';
import { realStore } from './sandbox-home.js';
import { needsCommands, needsRoot, testUnless } from './skip-unless.js';
import { nodeArgs } from './child-node.js';

const FILE = 'first-run';
const NOBODY = 65534;
const BASE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

// Root for the release steps (mmdebstrap's root mode) and to become the ordinary user.
// (In the nested host the tree comes from the store's base through debugfs: see setup().)
const cannot = needsRoot() ?? needsPrograms('docker-registry', 'skopeo', NESTED ? 'debugfs' : 'mmdebstrap', 'setpriv', 'tar') ?? needsCommands('npm');
const hostTest = testUnless(FILE, cannot, cannot?.startsWith('needs root') ? 'root' : 'tools');
const support = await linuxGuestSupport();
const linuxTest = testUnless(FILE, cannot ?? (support.ok ? null : `this host cannot boot a Linux guest: ${support.reason}`), cannot ? 'tools' : 'linux-guest');

/** Compilers and build tools a first run must not need: none of these is on the user's PATH. */
const BUILD_TOOLS = /^(cc|c\+\+|c89|c99|cpp|gcc|g\+\+|make|gmake|ccache|clang.*|musl-.*|python.*|node-gyp|(x86_64|i686)-linux-gnu-.*|(gcc|g\+\+|cpp)-\d+)$/;

interface Fixture {
  scratch: string;
  bin: string;
  project: string;
  userHome: string;
  registry: TestRegistry;
  npm: NpmRegistry;
  baseRef: string;
}

let fixture: Promise<Fixture> | undefined;
let installed = false;

interface Ran {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `args` as nobody without blocking this process (the npm registry answers from it). */
function asNobody(args: string[], opts: { cwd: string; env: Record<string, string>; groups?: number[]; timeoutMs?: number }): Promise<Ran> {
  const groups = opts.groups?.length ? ['--groups', opts.groups.join(',')] : ['--clear-groups'];
  const child = spawn('setpriv', ['--reuid', String(NOBODY), '--regid', String(NOBODY), ...groups, '--', ...args], {
    cwd: opts.cwd,
    env: opts.env,
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: opts.timeoutMs ?? 600_000,
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

/** A PATH of one directory: every program of the host's PATH but compilers and build tools. */
async function userBin(dir: string): Promise<void> {
  await mkdir(dir);
  const seen = new Set<string>();
  for (const from of [...(process.env.PATH ?? '').split(':'), ...BASE_PATH.split(':')]) {
    if (!from || !existsSync(from)) continue;
    for (const name of readdirSync(from)) {
      if (seen.has(name) || BUILD_TOOLS.test(name)) continue;
      seen.add(name);
      await symlink(join(from, name), join(dir, name));
    }
  }
}

async function chownTree(path: string): Promise<void> {
  const r = spawnSync('chown', ['-R', `${NOBODY}:${NOBODY}`, path]);
  assert.is(r.status, 0, `chown -R ${path}`);
}

function setup(): Promise<Fixture> {
  fixture ??= (async () => {
    const scratch = await mkdtemp(join(tmpdir(), 'torpor-first-run-'));
    await chmod(scratch, 0o755);
    const t0 = Date.now();

    // The base image as a release makes it (scripts/build-base-image.ts: guest/image/build.sh's
    // tree as one layer, recorded by digest), published with skopeo into a registry on 127.0.0.1.
    const registry = await startRegistry(join(scratch, 'registry'));
    const layout = join(scratch, 'base-layout');
    const baseRecord = join(scratch, 'base-image.json');
    const from: string[] = [];
    if (NESTED) {
      // L1 reaches no Debian mirror: the tree is the store's Debian base (copied into L1 by the
      // nested runner), dumped with debugfs as build.sh --tar would have written it (rdump keeps
      // owners and modes, not setuid bits or xattrs: enough to boot and run a command), packed
      // with gzip -1 (level 9 takes minutes under the emulator).
      const baseDir = await baseArtifactDir(realStore);
      const dumped = join(scratch, 'base-tree');
      const tree = join(dumped, 'tree');
      await mkdir(tree, { recursive: true });
      const rdump = spawnSync('debugfs', ['-R', `rdump / ${tree}`, join(baseDir, 'base.ext4')], { encoding: 'utf8' });
      assert.is(rdump.status, 0, rdump.stderr);
      const tar = spawnSync('tar', ['--numeric-owner', '--sort=name', '-C', tree, '-cf', join(dumped, 'base.tar'), '.'], { encoding: 'utf8' });
      assert.is(tar.status, 0, tar.stderr);
      await rm(tree, { recursive: true, force: true });
      await cp(join(baseDir, 'packages.txt'), join(dumped, 'packages.txt'));
      from.push('--from', dumped, '--gzip-level', '1');
    }
    const made = spawnSync(
      process.execPath,
      nodeArgs(join(packageRoot, 'scripts', 'build-base-image.ts'), '--layout', layout, '--repository', `${registry.host}/torpor/base`, '--record', baseRecord, ...from, '--json'),
      { cwd: packageRoot, encoding: 'utf8', maxBuffer: 64 << 20 },
    );
    assert.is(made.status, 0, made.stderr.slice(-4000) + made.stdout);
    const base = JSON.parse(made.stdout) as { reference: string; layer: { size: number }; seconds: number };
    const push = spawnSync('skopeo', ['copy', '--quiet', '--preserve-digests', '--dest-tls-verify=false', `oci:${layout}:bookworm`, `docker://${registry.host}/torpor/base:bookworm`], {
      encoding: 'utf8',
    });
    assert.is(push.status, 0, push.stderr);
    await rm(layout, { recursive: true });
    const baseRef = base.reference;
    const tImage = Date.now();

    // The prebuilt guest package and torpor's tarball with the record that names its bytes.
    const kpkg = join(scratch, 'kernel-package');
    await mkdir(kpkg);
    for (const f of ['package.json', 'README.md']) await cp(join(packageRoot, 'packages', 'kernel-linux-x64', f), join(kpkg, f));
    const record = join(scratch, 'kernel-release.json');
    const build = spawnSync(process.execPath, nodeArgs(join(packageRoot, 'scripts', 'build-kernel-package.ts'), '--out', kpkg, '--record', record), {
      cwd: packageRoot,
      encoding: 'utf8',
    });
    assert.is(build.status, 0, build.stderr + build.stdout);
    const kernelTgz = join(scratch, pack(['--pack-destination', scratch], kpkg).filename);
    const tPackage = Date.now();
    ensurePackInputs();
    const torporTgz = join(scratch, pack(['--pack-destination', scratch]).filename);
    // What a release does: the record goes into torpor's tarball beside its package.json.
    const stage = join(scratch, 'stage');
    await mkdir(stage);
    assert.is(spawnSync('tar', ['-xzf', torporTgz, '-C', stage]).status, 0);
    await cp(record, join(stage, 'package', 'kernel-release.json'));
    await cp(baseRecord, join(stage, 'package', 'base-image.json'));
    assert.is(spawnSync('tar', ['-czf', torporTgz, '-C', stage, 'package']).status, 0);
    await rm(stage, { recursive: true });

    // The npm registry the user installs from: torpor, its kernel package and its dependencies
    // (their tarballs from npm's cache as the public registry served them to this checkout; in
    // the nested host the host's cache, which test/nested/run.ts names).
    const npm = await startNpmRegistry({ maxBodySize: '1gb' });
    const token = await registryToken(npm.url);
    const cacheFrom = process.env.TORPOR_TEST_NPM_CACHE ?? spawnSync('npm', ['config', 'get', 'cache'], { encoding: 'utf8' }).stdout.trim();
    const deps = runtimeTarballs(cacheFrom);
    for (const d of deps) await publishTarball(npm.url, token, d.tgz);
    for (const tgz of [kernelTgz, torporTgz]) await publishTarball(npm.url, token, await readFile(tgz));

    const bin = join(scratch, 'bin');
    await userBin(bin);
    const userHome = join(scratch, 'home');
    await mkdir(userHome);
    const project = join(scratch, 'project');
    await mkdir(project);
    await writeFile(join(project, 'package.json'), JSON.stringify({ name: 'first-run', version: '1.0.0', private: true, type: 'module' }));
    for (const dir of [userHome, project]) await chownTree(dir);
    console.log(
      `  first-run: fixtures in ${((Date.now() - t0) / 1000).toFixed(1)} s (base image: built in ${base.seconds.toFixed(1)} s, ` +
        `${(base.layer.size / 2 ** 20).toFixed(1)} MiB layer, pushed by ${((tImage - t0) / 1000).toFixed(1)} s; kernel package and torpor packed by ` +
        `${((tPackage - t0) / 1000).toFixed(1)} s; npm registry with torpor and ${deps.length} dependencies)`,
    );
    return { scratch, bin, project, userHome, registry, npm, baseRef };
  })();
  return fixture;
}

function userEnv(f: Fixture, extra: Record<string, string> = {}): Record<string, string> {
  return { HOME: f.userHome, PATH: f.bin, npm_config_registry: f.npm.url, TORPOR_HOME: join(f.userHome, 'torpor'), ...extra };
}

test.after(async () => {
  if (!fixture) return;
  const f = await fixture.catch(() => undefined);
  if (!f) return;
  await f.registry.stop();
  await f.npm.close();
  await rm(f.scratch, { recursive: true, force: true });
});

const timings: Record<string, number> = {};

/** Today's cold path, as this store's own builds of it took (manifest.json's buildMs, with when). */
async function coldPath(): Promise<string> {
  const spec = await builtKernelSpec();
  const parts: string[] = [];
  for (const [what, dir] of [
    ['kernel build', artifactDir(realStore, spec.kind, artifactKey(spec.kind, spec.inputs))],
    ['Debian base (mmdebstrap)', await baseArtifactDir(realStore)],
  ] as const) {
    const m = JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8').catch(() => 'null')) as { buildMs?: number; createdAt?: string } | null;
    parts.push(m?.buildMs ? `${what} ${(m.buildMs / 1000).toFixed(0)} s (built ${m.createdAt})` : `${what} not in this store`);
  }
  return parts.join(', ');
}

hostTest('installed by an ordinary user with no compiler: setup takes the prebuilt kernel and agent and pulls the base image, building nothing', async () => {
  const f = await setup();
  const noCompiler = spawnSync('sh', ['-c', 'command -v cc gcc g++ c++ make python3 musl-gcc'], { env: userEnv(f), encoding: 'utf8' });
  assert.is(noCompiler.stdout, '', 'no compiler on the user\'s PATH');

  let t = Date.now();
  // What the README's install section says, and nothing else: the kernel package comes as torpor's optional dependency.
  const install = await asNobody(['npm', 'install', '--no-audit', '--no-fund', 'torpor'], { cwd: f.project, env: userEnv(f) });
  assert.is(install.status, 0, install.stderr);
  timings.install = Date.now() - t;
  installed = true;
  const modules = join(f.project, 'node_modules');
  assert.ok(existsSync(join(modules, '@torpor', 'kernel-linux-x64', 'vmlinux')), 'the kernel package is installed');
  assert.ok(existsSync(join(modules, 'torpor', 'kernel-release.json')), "torpor's release record is installed");
  assert.not.ok(existsSync(join(modules, 'torpor', 'build')), 'nothing was compiled at install');

  // No TORPOR_BASE_IMAGE: the base is the image this release names (base-image.json).
  const env = userEnv(f);
  const doctor = await asNobody(['npx', '--offline', 'torpor', 'doctor'], { cwd: f.project, env });
  assert.match(doctor.stdout, /^kernel: prebuilt: @torpor\/kernel-linux-x64@0\.1\.0, Linux /m, doctor.stdout + doctor.stderr);
  assert.match(doctor.stdout, /^agent: prebuilt: @torpor\/kernel-linux-x64@0\.1\.0 /m);
  assert.match(doctor.stdout, new RegExp(`^base root filesystem: container image ${f.baseRef.replace(/[.]/g, '\\.')} \\(torpor's default, named by its base-image\\.json\\)`, 'm'));
  assert.match(doctor.stdout, /^first run will: fetch the kernel from @torpor\/kernel-linux-x64@0\.1\.0 .*; fetch the base image /m);

  t = Date.now();
  const setupRun = await asNobody(['npx', '--offline', 'torpor', 'setup', '--json'], { cwd: f.project, env });
  assert.is(setupRun.status, 0, setupRun.stderr);
  timings.setup = Date.now() - t;
  const report = JSON.parse(setupRun.stdout) as { built: string[]; fetched: string[]; kernelOrigin: string; baseSource: string; rootfs: string };
  assert.equal(report.built, [], 'nothing built from source');
  assert.is(report.kernelOrigin, 'package');
  assert.is(report.baseSource, f.baseRef);
  assert.equal(report.fetched.map((x) => x.split(' ')[0]).sort(), ['agent', 'base', 'kernel']);
  // The progress went to stderr: bytes and rate while downloading, then the image's own steps.
  assert.match(setupRun.stderr, /rootfs: .*download [0-9a-f]{12} of \d+\.\d MiB at [\d.]+ MiB\/s/);
  assert.ok(statSync(report.rootfs).size > 0);

  // Later runs find everything stored and fetch nothing.
  t = Date.now();
  const again = await asNobody(['npx', '--offline', 'torpor', 'setup', '--json'], { cwd: f.project, env: userEnv(f) });
  assert.is(again.status, 0, again.stderr);
  const second = JSON.parse(again.stdout) as typeof report;
  assert.equal([second.built, second.fetched, second.baseSource], [[], [], f.baseRef]);
  console.log(
    `  first-run: as uid ${NOBODY} with no compiler: npm install ${(timings.install / 1000).toFixed(1)} s, ` +
      `torpor setup ${(timings.setup / 1000).toFixed(1)} s (kernel and agent from the package, base image pulled and made), ` +
      `setup again ${((Date.now() - t) / 1000).toFixed(1)} s`,
  );
  console.log(`  first-run: the cold path it replaces, as this store built it: ${await coldPath()}`);
});

hostTest('a kernel package whose kernel differs from the release record is refused, and nothing of it is stored', async () => {
  const f = await setup();
  assert.ok(installed, 'the first test installed the project');
  const vmlinux = join(f.project, 'node_modules', '@torpor', 'kernel-linux-x64', 'vmlinux');
  const home = join(f.userHome, 'torpor-tampered');
  // One byte changed in the middle of the kernel, as a corrupted or substituted package would have.
  const fh = await open(vmlinux, 'r+');
  const at = Math.floor((await fh.stat()).size / 2);
  const byte = Buffer.alloc(1);
  try {
    await fh.read(byte, 0, 1, at);
    await fh.write(Buffer.from([byte[0]! ^ 0xff]), 0, 1, at);
    const r = await asNobody(['npx', '--offline', 'torpor', 'setup'], { cwd: f.project, env: userEnv(f, { TORPOR_HOME: home }) });
    assert.is.not(r.status, 0);
    assert.match(r.stderr, /KERNEL_PACKAGE_MISMATCH/);
    assert.match(r.stderr, /vmlinux has sha256 [0-9a-f]{64}, but torpor 0\.1\.0 was released with [0-9a-f]{64}/);
    const stored = join(home, 'artifacts', 'kernel-package');
    const kept = existsSync(stored) ? readdirSync(stored).filter((d) => existsSync(join(stored, d, 'vmlinux'))) : [];
    assert.equal(kept, [], 'no kernel of the package was stored');
  } finally {
    await fh.write(byte, 0, 1, at);
    await fh.close();
  }
});

linuxTest('Sandbox.create() and a command in the installed project, as that user', async () => {
  const f = await setup();
  assert.ok(installed, 'the first test installed the project');
  // /dev/kvm as Debian's udev leaves it (root:kvm 0660), the user in its group. (L1 of the
  // nested host has no udev: its devtmpfs node is root's alone until given to the group.)
  const kvm = statSync('/dev/kvm');
  if ((kvm.mode & 0o060) !== 0o060) await chmod('/dev/kvm', (kvm.mode & 0o7777) | 0o060);
  const script = join(f.project, 'first.mjs');
  await writeFile(
    script,
    [
      "import { Sandbox } from 'torpor';",
      'const t0 = Date.now();',
      'const sbx = await Sandbox.create({ network: false, boot: { timeoutMs: 240_000 } });',
      "const r = await sbx.commands.run('echo \"$(id -un) on $(uname -r): $(head -1 /etc/os-release)\"');",
      'console.log(JSON.stringify({ ms: Date.now() - t0, stdout: r.stdout, exitCode: r.exitCode }));',
      'await sbx.kill();',
    ].join('\n'),
  );
  await chown(script, NOBODY, NOBODY);
  const t = Date.now();
  const r = await asNobody(['node', script], { cwd: f.project, env: userEnv(f), groups: [kvm.gid] });
  assert.is(r.status, 0, r.stderr + r.stdout);
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { ms: number; stdout: string; exitCode: number };
  assert.is(out.exitCode, 0);
  assert.match(out.stdout, /^\w+ on 6\.1\.\d+\S*: PRETTY_NAME="Debian GNU\/Linux 12 \(bookworm\)"\n$/);
  const total = (timings.install ?? 0) + (timings.setup ?? 0) + (Date.now() - t);
  console.log(
    `  first-run: Sandbox.create + first command ${(out.ms / 1000).toFixed(1)} s; install -> first command output ${(total / 1000).toFixed(1)} s ` +
      `(base image download from 127.0.0.1 included)${NESTED ? ' (emulated host: not a performance figure)' : ''}; ${out.stdout.trim()}`,
  );
});

test.run();
