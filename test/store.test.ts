// The artifact store: content keys, one build under concurrency, damage
// detection and rebuild, no half-written artifacts after a failed build.
import { spawn, spawnSync } from 'node:child_process';
import { appendFile, chmod, mkdir, mkdtemp, open, readdir, readFile, rm, stat, truncate, utimes, writeFile } from 'node:fs/promises';
import { mkdtempSync, rmdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { artifactDir, artifactKey, checkArtifact, ensureArtifact, removeBuildDir, type ArtifactSpec } from '../lib/store/artifact.js';
import { homeLayout, torporHome } from '../lib/store/home.js';
import { needsRoot, needsRootAnd, testUnless } from './skip-unless.js';

const artifactModule = pathToFileURL(join(import.meta.dirname, '..', 'lib', 'store', 'artifact.ts')).href;

async function tempRoot(): Promise<string> {
  return mkdtemp(join(tmpdir(), 'torpor-store-test-'));
}

/** A spec whose build writes `payload` (1 MiB of it) and counts its runs in `counter`. */
function spec(payload: string, counter: string, extra: Partial<ArtifactSpec> = {}): ArtifactSpec {
  return {
    kind: 'demo',
    inputs: { payload },
    files: ['data.bin'],
    build: async (dir) => {
      await appendFile(counter, 'x');
      await writeFile(join(dir, 'data.bin'), Buffer.alloc(1 << 20, payload));
    },
    ...extra,
  };
}

async function runs(counter: string): Promise<number> {
  return (await readFile(counter, 'utf8').catch(() => '')).length;
}

test('torporHome follows TORPOR_HOME, then XDG_DATA_HOME, then ~/.local/share', () => {
  assert.is(torporHome({ TORPOR_HOME: '/x/y' }), '/x/y');
  assert.is(torporHome({ XDG_DATA_HOME: '/data' }), '/data/torpor');
  assert.ok(torporHome({ HOME: '/home/u' }).endsWith('/.local/share/torpor'));
  const layout = homeLayout('/h');
  assert.is(layout.artifacts, '/h/artifacts');
  assert.is(layout.templates, '/h/templates');
  assert.is(layout.sandboxes, '/h/sandboxes');
});

test('keys change when any input changes, and only then', () => {
  const base = artifactKey('kernel', { config: 'CONFIG_PVH=y\n', script: 'make vmlinux', version: '6.1.192-3' });
  assert.is(artifactKey('kernel', { version: '6.1.192-3', script: 'make vmlinux', config: 'CONFIG_PVH=y\n' }), base, 'input order does not matter');
  assert.is.not(artifactKey('kernel', { config: 'CONFIG_PVH=n\n', script: 'make vmlinux', version: '6.1.192-3' }), base);
  assert.is.not(artifactKey('kernel', { config: 'CONFIG_PVH=y\n', script: 'make -j2 vmlinux', version: '6.1.192-3' }), base);
  assert.is.not(artifactKey('kernel', { config: 'CONFIG_PVH=y\n', script: 'make vmlinux', version: '6.1.192-4' }), base);
  assert.is.not(artifactKey('rootfs', { config: 'CONFIG_PVH=y\n', script: 'make vmlinux', version: '6.1.192-3' }), base, 'kind is part of the key');
  // Bytes and strings with the same content hash alike.
  assert.is(artifactKey('k', { a: Buffer.from('same') }), artifactKey('k', { a: 'same' }));
});

test('a built artifact is recorded, found again without building, and its manifest checks out', async () => {
  const root = await tempRoot();
  const counter = join(root, 'count');
  try {
    const first = await ensureArtifact(spec('a', counter), { root });
    assert.ok(first.built);
    const record = first.manifest.files['data.bin']!;
    assert.is(record.size, 1 << 20);
    assert.match(record.sha256, /^[0-9a-f]{64}$/);
    const second = await ensureArtifact(spec('a', counter), { root });
    assert.not.ok(second.built);
    assert.is(second.dir, first.dir);
    assert.is(await runs(counter), 1);
    // A changed input is a different artifact.
    const other = await ensureArtifact(spec('b', counter), { root });
    assert.ok(other.built);
    assert.is.not(other.dir, first.dir);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('two processes building at once produce one artifact, built once', async () => {
  const root = await tempRoot();
  const counter = join(root, 'count');
  // Each child: the real store, a build slow enough (800 ms) that both are inside ensureArtifact together.
  const code = `
    import { appendFile, writeFile } from 'node:fs/promises';
    import { join } from 'node:path';
    const { ensureArtifact } = await import(${JSON.stringify(artifactModule)});
    const r = await ensureArtifact({
      kind: 'demo', inputs: { payload: 'shared' }, files: ['data.bin'],
      build: async (dir) => {
        await appendFile(${JSON.stringify(counter)}, 'x');
        await writeFile(join(dir, 'data.bin'), 'part one ');
        await new Promise((r) => setTimeout(r, 800));
        await appendFile(join(dir, 'data.bin'), 'part two');
      },
    }, { root: ${JSON.stringify(root)} });
    process.stdout.write(JSON.stringify({ dir: r.dir, built: r.built }));
  `;
  const child = () =>
    new Promise<{ dir: string; built: boolean }>((resolve, reject) => {
      const p = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
      let out = '';
      p.stdout.on('data', (d: Buffer) => (out += d));
      p.on('error', reject);
      p.on('close', (c) => (c === 0 ? resolve(JSON.parse(out) as { dir: string; built: boolean }) : reject(new Error(`builder exited ${c}`))));
    });
  try {
    const [a, b] = await Promise.all([child(), child()]);
    assert.is(a.dir, b.dir);
    assert.is([a.built, b.built].filter(Boolean).length, 1, 'exactly one process built');
    assert.is(await runs(counter), 1, 'the build ran once');
    assert.is(await readFile(join(a.dir, 'data.bin'), 'utf8'), 'part one part two');
    const entries = await readdir(join(root, 'demo'));
    assert.equal(entries.filter((e) => !e.endsWith('.lock')), [a.dir.split('/').pop()!], 'no temporary directories left');
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('a truncated artifact is detected and rebuilt', async () => {
  const root = await tempRoot();
  const counter = join(root, 'count');
  try {
    const first = await ensureArtifact(spec('t', counter), { root });
    const file = join(first.dir, 'data.bin');
    await chmod(file, 0o644); // stored read-only: the damage is deliberate
    await truncate(file, 4096);
    const check = await checkArtifact(first.dir, first.key, ['data.bin']);
    assert.not.ok(check.ok);
    if (!check.ok) assert.match(check.reason, /4096 bytes/);
    const damaged: string[] = [];
    const again = await ensureArtifact(spec('t', counter), { root, onDamaged: (_d, why) => damaged.push(why) });
    assert.ok(again.built);
    assert.is(damaged.length, 1);
    assert.is((await stat(file)).size, 1 << 20);
    assert.is(await runs(counter), 2);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('an altered artifact is detected: by mtime on use, and by --verify even with its mtime restored', async () => {
  const root = await tempRoot();
  const counter = join(root, 'count');
  try {
    const first = await ensureArtifact(spec('m', counter), { root });
    const file = join(first.dir, 'data.bin');
    const before = await stat(file);
    await chmod(file, 0o644); // stored read-only: the damage is deliberate
    // Flip one byte in the middle: same size, same head and tail.
    const fh = await open(file, 'r+');
    await fh.write(Buffer.from('!'), 0, 1, 512 * 1024);
    await fh.close();
    const touched = await checkArtifact(first.dir, first.key, ['data.bin']);
    assert.not.ok(touched.ok, 'a changed mtime triggers the full hash');
    if (!touched.ok) assert.match(touched.reason, /sha256/);

    // Someone restores the old mtime: the cheap check cannot see it, --verify can.
    await utimes(file, before.atime, before.mtime);
    assert.ok((await checkArtifact(first.dir, first.key, ['data.bin'])).ok, 'cheap check is cheap');
    assert.not.ok((await checkArtifact(first.dir, first.key, ['data.bin'], true)).ok);
    const rebuilt = await ensureArtifact(spec('m', counter), { root, verify: true });
    assert.ok(rebuilt.built);
    const data = await readFile(file);
    assert.ok(data.every((b) => b === 'm'.charCodeAt(0)));
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('a failed build leaves nothing half-written and releases the lock', async () => {
  const root = await tempRoot();
  const counter = join(root, 'count');
  try {
    const failing = spec('f', counter, {
      build: async (dir) => {
        await writeFile(join(dir, 'data.bin'), 'half');
        throw new TorporError('SETUP_FAILED', 'compiler exploded');
      },
    });
    const err = await ensureArtifact(failing, { root }).catch((e: unknown) => e);
    assert.instance(err, TorporError);
    assert.is((err as TorporError).code, 'SETUP_FAILED');
    const key = artifactKey('demo', { payload: 'f' });
    const entries = await readdir(join(root, 'demo'));
    assert.equal(entries.filter((e) => !e.endsWith('.lock')), [], 'no artifact and no temporary directory');
    assert.not.ok((await checkArtifact(artifactDir(root, 'demo', key), key, ['data.bin'])).ok);

    // A build that "succeeds" without its declared output is a failure too.
    const empty = spec('f', counter, { build: async () => undefined });
    const err2 = await ensureArtifact(empty, { root }).catch((e: unknown) => e);
    assert.is((err2 as TorporError).code, 'SETUP_FAILED');
    assert.match((err2 as Error).message, /did not produce data\.bin/);

    // The lock was released: the next build proceeds.
    const ok = await ensureArtifact(spec('f', counter), { root });
    assert.ok(ok.built);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('a builder killed mid-build (SIGKILL) blocks nobody; its temporary directory is swept', async () => {
  const root = await tempRoot();
  const counter = join(root, 'count');
  const code = `
    const { ensureArtifact } = await import(${JSON.stringify(artifactModule)});
    await ensureArtifact({
      kind: 'demo', inputs: { payload: 'k' }, files: ['data.bin'],
      build: async () => { process.stdout.write('building\\n'); await new Promise(() => setInterval(() => {}, 1000)); },
    }, { root: ${JSON.stringify(root)} });
  `;
  try {
    const p = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => p.stdout.on('data', (d: Buffer) => d.toString().includes('building') && resolve()));
    const entriesDuring = await readdir(join(root, 'demo'));
    assert.ok(entriesDuring.some((e) => e.startsWith('.tmp-')), 'it was building in a temporary directory');
    p.kill('SIGKILL');
    await new Promise((r) => p.on('close', r));
    const started = Date.now();
    const result = await ensureArtifact(spec('k', counter), { root });
    assert.ok(result.built);
    assert.ok(Date.now() - started < 5000, 'the dead builder did not hold the lock');
    const entries = await readdir(join(root, 'demo'));
    assert.not.ok(entries.some((e) => e.startsWith('.tmp-')), 'the dead builder\'s temporary directory is gone');
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('stored files are read-only; a lost or nonsense manifest is detected and the artifact rebuilt', async () => {
  const root = await tempRoot();
  const counter = join(root, 'count');
  try {
    const first = await ensureArtifact(spec('r', counter), { root });
    assert.is((await stat(join(first.dir, 'data.bin'))).mode & 0o222, 0, 'no write bits');
    // The directory stays, its manifest is gone: rebuilt into the same place (it used to fail on rename).
    await rm(join(first.dir, 'manifest.json'));
    const check = await checkArtifact(first.dir, first.key, ['data.bin']);
    assert.equal(check, { ok: false, exists: true, reason: 'manifest missing' });
    const again = await ensureArtifact(spec('r', counter), { root });
    assert.ok(again.built);
    assert.is(again.dir, first.dir);
    // Manifests that parse but are not one: each is a damaged artifact, not an exception.
    for (const text of ['null', '[]', '42', '{"version":1}', `{"version":1,"key":"${first.key}","files":null}`,
      `{"version":1,"key":"${first.key}","files":{"data.bin":{"size":"big"}}}`]) {
      await chmod(join(first.dir, 'manifest.json'), 0o644);
      await writeFile(join(first.dir, 'manifest.json'), text);
      const c = await checkArtifact(first.dir, first.key, ['data.bin']);
      assert.is(c.ok, false, text);
      const rebuilt = await ensureArtifact(spec('r', counter), { root });
      assert.ok(rebuilt.built, text);
    }
    const entries = await readdir(join(root, 'demo'));
    assert.equal(entries.filter((e) => !e.endsWith('.lock')), [first.dir.split('/').pop()!], 'damaged copies were cleared');
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

testUnless('store', needsRootAnd('setpriv'), 'root')('a store the user cannot write gives PERMISSION_DENIED saying what to do', async () => {
  const root = await tempRoot();
  try {
    await chmod(root, 0o755); // root-owned, readable by all, writable by root only
    const code = `
      const { ensureArtifact } = await import(${JSON.stringify(artifactModule)});
      try {
        await ensureArtifact({ kind: 'demo', inputs: { x: '1' }, files: ['f'], build: async () => {} }, { root: ${JSON.stringify(root)} });
      } catch (err) { process.stdout.write(JSON.stringify({ code: err.code, message: err.message })); }
    `;
    const r = spawnSync('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', process.execPath, '--import', 'tsx', '--input-type=module', '-e', code], {
      encoding: 'utf8',
      env: { ...process.env, HOME: '/nonexistent' },
    });
    const out = JSON.parse(r.stdout || '{}') as { code?: string; message?: string };
    assert.is(out.code, 'PERMISSION_DENIED', r.stdout + r.stderr);
    assert.match(out.message!, /TORPOR_HOME to a directory you own/);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

/** Why a tmpfs cannot be mounted here (not root, or no CAP_SYS_ADMIN in a container), or null. */
function tmpfsSkipReason(): string | null {
  const noRoot = needsRoot();
  if (noRoot) return `mounting a tmpfs ${noRoot}`;
  const probe = mkdtempSync(join(tmpdir(), 'torpor-mount-probe-'));
  try {
    if (spawnSync('mount', ['-t', 'tmpfs', 'none', probe]).status !== 0) return 'cannot mount a tmpfs here';
    spawnSync('umount', [probe]);
    return null;
  } finally {
    rmdirSync(probe);
  }
}

testUnless('store', tmpfsSkipReason(), 'root')('a build directory with something mounted inside is never deleted recursively', async () => {
  const root = await tempRoot();
  const dir = join(root, '.tmp-abc-1-x');
  const inner = join(dir, 'tree', 'proc');
  await mkdir(inner, { recursive: true });
  const mounted = spawnSync('mount', ['-t', 'tmpfs', 'none', inner]).status === 0;
  try {
    assert.ok(mounted, 'mount -t tmpfs');
    await writeFile(join(inner, 'precious'), 'host data');
    const err = await removeBuildDir(dir).catch((e: unknown) => e);
    assert.is((err as TorporError).code, 'SETUP_FAILED');
    assert.match((err as Error).message, /still has mounts inside it/);
    assert.is(await readFile(join(inner, 'precious'), 'utf8'), 'host data');
  } finally {
    if (mounted) spawnSync('umount', [inner]);
    await removeBuildDir(root);
  }
});

test.run();
