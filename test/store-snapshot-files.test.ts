// A generation's manifest.json read back by lib (lib/store/snapshot-files.ts): the addon names the
// files, lib checks what it reads (the manifest is data on disk) and reads older manifests too.
// Manifests here are files on disk as an addon or a damaged disk would leave them; the addon's
// own are read in test/vmm-snapshot.test.ts.
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { currentGenerationOf, generationLayout, isPlainRelativePath, readGenerationFiles, readGenerationFilesOrNull, writeCurrent } from '../lib/store/snapshot-files.js';

function snapshotDir(): string {
  return mkdtempSync(join(tmpdir(), 'torpor-manifest-'));
}

function writeManifest(dir: string, generation: number, body: unknown): void {
  const p = join(dir, generationLayout(generation).manifest);
  mkdirSync(dirname(p), { recursive: true });
  writeFileSync(p, typeof body === 'string' ? body : JSON.stringify(body));
}

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return err instanceof TorporError ? err.code : `not a TorporError: ${String(err)}`;
  }
  return undefined;
}

test("the addon's layout: a generation's files relative to the snapshot directory", () => {
  const g = generationLayout(7, 2);
  assert.is(g.manifest.startsWith(g.dir + '/'), true);
  for (const p of [g.state, g.memoryLayer, g.manifest, ...g.diskOverlays]) assert.ok(isPlainRelativePath(p), p);
  assert.is(g.diskOverlays.length, 2);
  assert.is(new Set([g.state, g.memoryLayer, g.manifest, ...g.diskOverlays]).size, 5);
});

test('a manifest as the addon writes it: chain, disks and state, inside or absolute', () => {
  const dir = snapshotDir();
  try {
    const g = generationLayout(3, 1);
    writeManifest(dir, 3, {
      generation: 3,
      parent: 2,
      memory: { kind: 'diff', pages: 12 },
      layers: ['/templates/t/k/b-1/gen-1/mem.layer', 'layers/merged-2-1.layer', g.memoryLayer],
      disks: [['/templates/t/k/b-1/gen-1/disk0.overlay', g.diskOverlays[0]!], []],
      state: g.state,
    });
    const files = readGenerationFiles(dir, 3);
    assert.equal(files, {
      generation: 3,
      manifest: g.manifest,
      state: g.state,
      memoryLayers: ['/templates/t/k/b-1/gen-1/mem.layer', 'layers/merged-2-1.layer', g.memoryLayer],
      disks: [['/templates/t/k/b-1/gen-1/disk0.overlay', g.diskOverlays[0]!], []],
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an older manifest (no disks, no state) still reads: the state file where the layout says', () => {
  const dir = snapshotDir();
  try {
    const g = generationLayout(1);
    writeManifest(dir, 1, { generation: 1, parent: 0, memory: { kind: 'full', pages: 3 }, layers: [g.memoryLayer] });
    const files = readGenerationFiles(dir, 1);
    assert.is(files.disks, null);
    assert.is(files.state, g.state);
    assert.equal(files.memoryLayers, [g.memoryLayer]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a missing, malformed or escaping manifest is SNAPSHOT_INVALID (null from the OrNull form)', () => {
  const dir = snapshotDir();
  try {
    assert.is(codeOf(() => readGenerationFiles(dir, 1)), 'SNAPSHOT_INVALID', 'missing');
    assert.is(readGenerationFilesOrNull(dir, 1), null);
    const ok = { generation: 2, layers: ['gen-2/mem.layer'] };
    const bad: [string, unknown][] = [
      ['not JSON', '{"generation":2,'],
      ['an array', [ok]],
      ['another generation', { ...ok, generation: 3 }],
      ['no layers', { generation: 2 }],
      ['empty chain', { ...ok, layers: [] }],
      ['a layer not a string', { ...ok, layers: [7] }],
      ['a layer climbing out', { ...ok, layers: ['../other/gen-1/mem.layer'] }],
      ['a layer with .. inside', { ...ok, layers: ['gen-2/../../x'] }],
      ['an absolute layer with ..', { ...ok, layers: ['/templates/../etc/passwd'] }],
      ['a NUL byte', { ...ok, layers: ['gen-2/mem\0.layer'] }],
      ['disks not a list of lists', { ...ok, disks: ['gen-2/disk0.overlay'] }],
      ['a disk layer climbing out', { ...ok, disks: [['gen-2/../../disk']] }],
      ['the state file outside the directory', { ...ok, state: '/etc/passwd' }],
      ['the state file climbing out', { ...ok, state: '../vm.state' }],
    ];
    for (const [what, body] of bad) {
      writeManifest(dir, 2, body);
      assert.is(codeOf(() => readGenerationFiles(dir, 2)), 'SNAPSHOT_INVALID', what);
      assert.is(readGenerationFilesOrNull(dir, 2), null, what);
    }
    assert.is(codeOf(() => readGenerationFiles(dir, 0)), 'SNAPSHOT_INVALID', 'generation 0');
    assert.is(codeOf(() => readGenerationFiles(dir, 1.5)), 'SNAPSHOT_INVALID', 'generation 1.5');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('`current` names a generation by its directory; anything else is none', async () => {
  const dir = snapshotDir();
  try {
    assert.is(await currentGenerationOf(dir), 0);
    writeFileSync(join(dir, 'current'), `${generationLayout(12).dir}\n`);
    assert.is(await currentGenerationOf(dir), 12);
    for (const text of ['12\n', `${generationLayout(12).dir}x\n`, `x${generationLayout(12).dir}\n`, `${generationLayout(12).dir}\n\n`]) {
      writeFileSync(join(dir, 'current'), text);
      assert.is(await currentGenerationOf(dir), 0, JSON.stringify(text));
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('writeCurrent switches `current` durably: the generation it names, no temporary left', async () => {
  const dir = snapshotDir();
  try {
    await writeCurrent(dir, 3);
    assert.is(await currentGenerationOf(dir), 3);
    await writeCurrent(dir, 4);
    assert.is(await currentGenerationOf(dir), 4);
    assert.equal(readdirSync(dir).filter((n) => n.startsWith('current')), ['current']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
