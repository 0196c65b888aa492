// Packs what a machine with hardware virtualization needs to run the Linux-guest
// suite offline into one tar.xz (at most 60 MiB): the built addon, the guest
// kernel, root filesystem and agent from the artifact store, the library and the
// test files compiled to JavaScript (no tsx or esbuild needed there, only Node 20+),
// uvu, and test/hardware/run.ts as run.js. Beside it: run-hardware.sh, which
// unpacks the bundle and runs it (see test/hardware/README.md).
//
//   npm run bundle:hardware [-- --out DIR]      (default DIR: ./out/hardware)
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, relative } from 'node:path';
import { parseArgs } from 'node:util';

import { transformSync } from 'esbuild';

const ROOT = join(import.meta.dirname, '..', '..');
/** The issue's bound on the compressed bundle. */
export const BUNDLE_LIMIT_BYTES = 60 * 1024 * 1024;
/** What the tests import at run time, with their dependencies (resolved below). tsx: several test
 *  files start their fixtures (test/fixtures/*.ts, shipped as they are) in a child process through it.
 *  tar-stream: lib/image; verdaccio: the npm registry test/template-linux.test.ts starts. */
const RUNTIME_PACKAGES = ['uvu', 'node-gyp-build', 'tsx', 'tar-stream', 'verdaccio'];

const { values } = parseArgs({ options: { out: { type: 'string', default: join(ROOT, 'out', 'hardware') } } });
const outDir = values.out!;

function step(what: string): void {
  process.stderr.write(`bundle: ${what}\n`);
}

function sha256(path: string): string {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

function mib(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

/** Every file under dir ending in ext, as paths relative to ROOT. */
function filesUnder(dir: string, ext: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
    const rel = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (entry.name !== 'fixtures' && entry.name !== 'node_modules') out.push(...filesUnder(rel, ext));
    } else if (entry.name.endsWith(ext)) {
      out.push(rel);
    }
  }
  return out;
}

/** A package and everything it depends on at run time, from the checkout's node_modules. */
function packageClosure(names: string[]): string[] {
  const seen = new Set<string>();
  const visit = (name: string): void => {
    if (seen.has(name)) return;
    const dir = join(ROOT, 'node_modules', name);
    if (!existsSync(join(dir, 'package.json'))) return; // an optional dependency for another platform
    seen.add(name);
    const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as {
      dependencies?: Record<string, string>;
      optionalDependencies?: Record<string, string>;
    };
    // Optional ones too: esbuild's binary for this platform is one (the others are not installed).
    for (const dep of Object.keys({ ...pkg.dependencies, ...pkg.optionalDependencies })) visit(dep);
  };
  names.forEach(visit);
  return [...seen].sort();
}

/** The store's artifacts as `torpor setup` reports them (building what is missing, where it can). */
function storeArtifacts(): { kernel: string; rootfs: string; agent: string } {
  const r = spawnSync(process.execPath, [join(ROOT, 'bin', 'torpor.js'), 'setup', '--json'], { encoding: 'utf8' });
  if (r.status !== 0) {
    throw new Error(`torpor setup could not provide the guest artifacts (run it first, as root):\n${r.stderr.trim()}`);
  }
  return JSON.parse(r.stdout) as { kernel: string; rootfs: string; agent: string };
}

const staging = mkdtempSync(join(tmpdir(), 'torpor-hw-bundle-'));
const tree = join(staging, 'torpor-hw');
try {
  const started = Date.now();
  const artifacts = storeArtifacts();
  const addon = join(ROOT, 'build', 'Release', 'torpor.node');
  if (!existsSync(addon)) throw new Error(`${addon} is missing: build the addon first (npm run build:native)`);
  const testvm = join(ROOT, 'guest', 'testvm', 'out', 'testvm.elf');
  if (!existsSync(testvm)) throw new Error(`${testvm} is missing: make -C guest/testvm`);

  step('compiling lib/ and test/ to JavaScript');
  for (const rel of [...filesUnder('lib', '.ts'), ...filesUnder('test', '.ts')]) {
    const out = join(tree, rel.replace(/\.ts$/, '.js'));
    mkdirSync(dirname(out), { recursive: true });
    // `await using` and friends are lowered for Node 20; imports already name .js files.
    const js = transformSync(readFileSync(join(ROOT, rel), 'utf8'), { loader: 'ts', format: 'esm', target: 'node20', sourcefile: rel });
    writeFileSync(out, js.code);
  }
  // The fixtures that tests start as child processes (`node --import tsx test/fixtures/x.ts`): as
  // TypeScript, since the tests name them so; their imports of lib/ find the compiled .js files.
  cpSync(join(ROOT, 'test', 'fixtures'), join(tree, 'test', 'fixtures'), { recursive: true });
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as Record<string, unknown>;
  writeFileSync(join(tree, 'package.json'), JSON.stringify({ name: pkg.name, version: pkg.version, type: 'module', private: true }, null, 2) + '\n');

  step('addon, test guest, image scripts (their contents key the stored image), runtime packages');
  mkdirSync(join(tree, 'build', 'Release'), { recursive: true });
  copyFileSync(addon, join(tree, 'build', 'Release', 'torpor.node'));
  mkdirSync(join(tree, 'guest', 'testvm', 'out'), { recursive: true });
  copyFileSync(testvm, join(tree, 'guest', 'testvm', 'out', 'testvm.elf'));
  cpSync(join(ROOT, 'guest', 'image'), join(tree, 'guest', 'image'), { recursive: true });
  const packages = packageClosure(RUNTIME_PACKAGES);
  for (const name of packages) cpSync(join(ROOT, 'node_modules', name), join(tree, 'node_modules', name), { recursive: true, dereference: true });

  step('guest artifacts');
  const art = join(tree, 'artifacts');
  mkdirSync(art);
  copyFileSync(artifacts.kernel, join(art, 'vmlinux'));
  copyFileSync(artifacts.agent, join(art, 'torpor-agent'));
  copyFileSync(join(dirname(artifacts.rootfs), 'packages.txt'), join(art, 'packages.txt'));
  // Sparse: the image is 508 MiB with about 200 MB in use; tar --sparse stores only the data.
  execFileSync('cp', ['--sparse=always', artifacts.rootfs, join(art, 'rootfs.ext4')]);
  for (const f of readdirSync(art)) chmodSync(join(art, f), 0o644);

  const commit = spawnSync('git', ['-C', ROOT, 'rev-parse', 'HEAD'], { encoding: 'utf8' }).stdout.trim();
  const dirty = spawnSync('git', ['-C', ROOT, 'status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8' }).stdout.trim() !== '';
  writeFileSync(
    join(tree, 'bundle.json'),
    JSON.stringify(
      {
        createdAt: new Date().toISOString(),
        commit: commit + (dirty ? '+dirty' : ''),
        node: process.version,
        artifacts: Object.fromEntries(readdirSync(art).map((f) => [f, { bytes: statSync(join(art, f)).size, sha256: sha256(join(art, f)) }])),
        packages,
      },
      null,
      2,
    ) + '\n',
  );

  step('compressing (tar --sparse | xz -9; a few minutes on 2 cores)');
  mkdirSync(outDir, { recursive: true });
  const bundle = join(outDir, 'torpor-hw.tar.xz');
  const tar = spawnSync('bash', ['-o', 'pipefail', '-c', 'tar --sparse -C "$1" -cf - torpor-hw | xz -9 -T2 > "$2"', 'tar', staging, bundle], { stdio: 'inherit' });
  if (tar.status !== 0) throw new Error('tar | xz failed');
  copyFileSync(join(import.meta.dirname, 'run.sh'), join(outDir, 'run-hardware.sh'));
  chmodSync(join(outDir, 'run-hardware.sh'), 0o755);

  const size = statSync(bundle).size;
  const rootfsUsed = Number(execFileSync('du', ['-B1', join(art, 'rootfs.ext4')], { encoding: 'utf8' }).split('\t')[0]);
  console.log(`bundle: ${relative(process.cwd(), bundle) || bundle} ${mib(size)} (limit ${mib(BUNDLE_LIMIT_BYTES)}), built in ${((Date.now() - started) / 1000).toFixed(0)} s`);
  console.log(`  rootfs ${mib(statSync(join(art, 'rootfs.ext4')).size)} sparse, ${mib(rootfsUsed)} in use; kernel ${mib(statSync(join(art, 'vmlinux')).size)}; commit ${commit.slice(0, 12)}${dirty ? '+dirty' : ''}`);
  console.log(`  run it on a hardware-virtualization host: ${basename(outDir)}/run-hardware.sh torpor-hw.tar.xz RESULTS_DIR`);
  if (size > BUNDLE_LIMIT_BYTES) {
    console.log(`bundle: OVER THE LIMIT by ${mib(size - BUNDLE_LIMIT_BYTES)}: the root filesystem does not fit; see test/hardware/README.md`);
    process.exitCode = 1;
  }
} finally {
  rmSync(staging, { recursive: true, force: true });
}
