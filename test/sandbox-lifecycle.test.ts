// The sandbox lifecycle's state table and the sandbox directory's meta.json checks, without a
// machine (they run on every host): lib/sandbox/lifecycle.ts, lib/store/sandbox-dir.ts.
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { loadNative } from '../lib/native.js';
import { IllegalTransitionError, Lifecycle, SANDBOX_STATES, canMove } from '../lib/sandbox/lifecycle.js';
import { SandboxDir, checkSandboxId, newSandboxId, parseMeta, sandboxIds, type SandboxMeta } from '../lib/store/sandbox-dir.js';

test('the states and their transitions (docs/architecture.md#lifecycle)', () => {
  assert.equal([...SANDBOX_STATES], ['starting', 'running', 'pausing', 'paused', 'resuming', 'killed', 'failed']);
  assert.ok(canMove('running', 'pausing') && canMove('pausing', 'paused') && canMove('paused', 'resuming') && canMove('resuming', 'running'));
  assert.not.ok(canMove('paused', 'running'), 'a paused sandbox resumes through resuming');
  assert.not.ok(canMove('running', 'paused'), 'and pauses through pausing');
  for (const s of SANDBOX_STATES) assert.not.ok(canMove('killed', s), `killed is final (${s})`);
  for (const s of SANDBOX_STATES) if (s !== 'killed' && s !== 'failed') assert.ok(canMove(s, 'killed') || s === 'starting', s);

  const life = new Lifecycle('running', 'sandbox sbx_0');
  const seen: string[] = [];
  life.onChange((to, from) => seen.push(`${from}->${to}`));
  life.to('pausing');
  life.to('paused');
  const err = (() => {
    try {
      life.to('running');
    } catch (e) {
      return e;
    }
  })();
  assert.ok(err instanceof IllegalTransitionError && err.code === 'INVALID_STATE', String(err));
  assert.is((err as IllegalTransitionError).from, 'paused');
  assert.is((err as IllegalTransitionError).to, 'running');
  assert.is(life.state, 'paused', 'an illegal transition changes nothing');
  const req = (() => {
    try {
      life.require('commands.run()', 'running');
    } catch (e) {
      return e;
    }
  })();
  assert.ok(req instanceof TorporError && req.code === 'INVALID_STATE');
  assert.match((req as Error).message, /needs sandbox sbx_0 to be running; it is paused\. Call sbx\.resume\(\) or Sandbox\.connect\(sandboxId\)/);
  assert.equal(seen, ['running->pausing', 'pausing->paused']);
});

const goodMeta = (id: string): SandboxMeta => ({
  id,
  template: 'base',
  createdAt: '2026-12-01T18:00:00.000Z',
  vcpus: 1,
  memoryMiB: 64,
  metadata: { a: 'b' },
  envs: {},
  kernel: '/k',
  rootfs: '/r',
  cmdline: 'console=ttyS0',
  state: 'paused',
  ownerPid: null,
  generation: 2,
  diskLayers: ['snapshots/gen-1/disk0.overlay', 'snapshots/gen-2/disk0.overlay'],
});

test('meta.json is checked before use: damage is SNAPSHOT_INVALID naming what is wrong', () => {
  const id = newSandboxId();
  assert.match(id, /^sbx_[0-9a-f]{16}$/);
  assert.equal(parseMeta(JSON.stringify(goodMeta(id)), 'meta.json'), goodMeta(id));
  const bad: Array<[string, (m: Record<string, unknown>) => void, RegExp]> = [
    ['not JSON', () => undefined, /not JSON/],
    ['state', (m) => (m.state = 'sleeping'), /unknown state/],
    ['vcpus', (m) => (m.vcpus = 0), /vcpus/],
    ['id', (m) => (m.id = '../x'), /id is malformed/],
    ['metadata', (m) => (m.metadata = { a: 1 }), /metadata/],
    ['diskLayers', (m) => (m.diskLayers = ['../../etc/passwd']), /diskLayers/],
    ['absolute layer', (m) => (m.diskLayers = ['/etc/passwd']), /diskLayers/],
    ['ownerPid', (m) => (m.ownerPid = -1), /ownerPid/],
    ['lostInterval', (m) => (m.lostInterval = { from: 1 }), /lostInterval/],
  ];
  for (const [what, damage, re] of bad) {
    const m = goodMeta(id) as unknown as Record<string, unknown>;
    damage(m);
    const text = what === 'not JSON' ? '{"id": ' : JSON.stringify(m);
    const err = (() => {
      try {
        parseMeta(text, 'meta.json');
      } catch (e) {
        return e;
      }
    })();
    assert.ok(err instanceof TorporError && err.code === 'SNAPSHOT_INVALID', `${what}: ${String(err)}`);
    assert.match((err as Error).message, re, what);
  }
  for (const id of ['sbx_nothere', '', 'sbx_0123456789abcdeF', '../sbx_0123456789abcdef', 42]) {
    assert.throws(() => checkSandboxId(id), (e: unknown) => e instanceof TorporError && e.code === 'INVALID_ARGUMENT');
  }
});

test('SandboxDir: meta.json round trip, SANDBOX_NOT_FOUND, disk layers of a generation, ids, removal', async () => {
  const home = await mkdtemp(join(tmpdir(), 'torpor-sbxdir-'));
  try {
    const dir = new SandboxDir(newSandboxId(), home);
    const missing = await dir.readMeta().catch((e: unknown) => e);
    assert.ok(missing instanceof TorporError && missing.code === 'SANDBOX_NOT_FOUND', String(missing));
    await dir.create();
    const meta = { ...goodMeta(dir.id), generation: 1, diskLayers: ['snapshots/gen-1/disk0.overlay'] };
    await dir.writeMeta(meta);
    assert.equal(await dir.readMeta(), meta);
    assert.is(JSON.parse(await readFile(dir.metaPath, 'utf8')).id, dir.id);
    // Generations 2 and 3 were written after meta.json last recorded one: their layers count too.
    for (const g of [1, 2, 3]) {
      await mkdir(join(dir.snapshots, `gen-${g}`), { recursive: true });
      await writeFile(join(dir.snapshots, `gen-${g}`, 'disk0.overlay'), '');
    }
    await writeFile(join(dir.snapshots, 'current'), 'gen-3\n');
    assert.is(await dir.currentGeneration(), 3);
    assert.equal(
      (await dir.diskLayersAt(meta, 3)).map((p) => p.slice(dir.path.length + 1)),
      ['snapshots/gen-1/disk0.overlay', 'snapshots/gen-2/disk0.overlay', 'snapshots/gen-3/disk0.overlay'],
    );
    assert.equal(
      (await dir.diskLayersAt(meta, 1)).map((p) => p.slice(dir.path.length + 1)),
      ['snapshots/gen-1/disk0.overlay'],
    );
    assert.equal(await sandboxIds(home), [dir.id]);
    await dir.remove();
    assert.equal(await sandboxIds(home), []);
    await dir.remove(); // again: nothing to do
  } finally {
    await rm(home, { recursive: true, force: true });
  }
});

test('SandboxDir.writeMeta replaces meta.json whole, leaves no temporary, and a failure is a coded error with errno', async () => {
  const home = await mkdtemp(join(tmpdir(), 'torpor-sbxdir-'));
  try {
    const dir = new SandboxDir(newSandboxId(), home);
    await dir.create();
    const first = goodMeta(dir.id);
    await dir.writeMeta(first);
    const second = { ...first, state: 'paused' as const, generation: 2, metadata: { note: 'x'.repeat(100_000) } };
    await dir.writeMeta(second);
    assert.equal(await dir.readMeta(), second);
    assert.equal(await readdir(dir.path), ['meta.json']);
    // The directory gone (a kill racing a write): IO_ERROR with ENOENT, nothing left behind.
    await rm(dir.path, { recursive: true });
    const err = await dir.writeMeta(first).catch((e: unknown) => e);
    assert.ok(err instanceof TorporError && err.code === 'IO_ERROR' && err.errno === 2, String(err));
    assert.not.ok(existsSync(dir.path));
    // The addon's call refuses what is not a path, and a temporary outside the file's directory,
    // as rejections (never a crash of the process).
    const native = loadNative() as unknown as { replaceFileDurably(...a: unknown[]): Promise<void> };
    for (const args of [[1, dir.metaPath, 'x'], ['', dir.metaPath, 'x'], [`${dir.metaPath}\0.tmp`, dir.metaPath, 'x'], [`${dir.metaPath}.tmp`, dir.metaPath, 7]]) {
      const bad = await native.replaceFileDurably(...args).catch((e: unknown) => e);
      assert.ok(bad instanceof TorporError && bad.code === 'INVALID_ARGUMENT', `${JSON.stringify(args)}: ${String(bad)}`);
    }
    const outside = await native.replaceFileDurably(join(home, 'x.tmp'), join(home, 'sub', 'x'), 'x').catch((e: unknown) => e);
    assert.ok(outside instanceof TorporError && outside.code === 'INTERNAL', String(outside));
  } finally {
    await rm(home, { recursive: true, force: true });
  }
});

test("SandboxDir.adoptDeadOwnerTop: a dead owner's flushed top moves into layers/; a top never flushed (empty map) or without a map is left out", async () => {
  const home = await mkdtemp(join(tmpdir(), 'torpor-sbxdir-'));
  try {
    const dir = new SandboxDir(newSandboxId(), home);
    await dir.create();
    const tops = join(dir.snapshots, 'tops');
    await mkdir(tops, { recursive: true });
    const top = (name: string, map: string | null) =>
      Promise.all([writeFile(join(tops, name), 'data'), map === null ? undefined : writeFile(join(tops, `${name}.map`), map)]);
    await top('disk0-r3-4242-0.overlay', ''); // never flushed
    await top('disk0-r3-4242-1.overlay', null); // its map lost
    assert.is(await dir.adoptDeadOwnerTop(3, 4242), null);
    await top('disk0-r3-4242-2.overlay', 'slot');
    const adopted = await dir.adoptDeadOwnerTop(3, 4242);
    assert.is(adopted, join(dir.snapshots, 'layers', 'disk0-recovered-g3-4242.overlay'));
    assert.is(await readFile(`${adopted!}.map`, 'utf8'), 'slot');
    assert.equal((await readdir(tops)).sort(), ['disk0-r3-4242-0.overlay', 'disk0-r3-4242-0.overlay.map', 'disk0-r3-4242-1.overlay']);
  } finally {
    await rm(home, { recursive: true, force: true });
  }
});

test.run();
