// files.* against the real agent on the host, in a scratch directory.
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { FileNotFoundError, TorporError } from '../lib/errors.js';
import { hostApi, isRoot, type HostApi } from './agent-harness.js';
import { testUnless } from './skip-unless.js';

let api: HostApi;
let dir: string;
test.before(async () => {
  api = await hostApi();
  dir = await mkdtemp(join(tmpdir(), 'torpor-files-'));
});
test.after(async () => {
  await api?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
const code = (c: string) => (e: unknown) => e instanceof TorporError && e.code === c;

test('0 B, 1 B and 50 MiB round-trip with identical sha256 (bytes and stream)', async () => {
  for (const size of [0, 1, 50 * 1024 * 1024]) {
    const data = size > 1 ? randomBytes(size) : Buffer.alloc(size, 0x5a);
    const path = join(dir, `blob-${size}`);
    const info = await api.files.write(path, data);
    assert.equal(info, { name: `blob-${size}`, type: 'file', path });
    assert.is(sha(await readFile(path)), sha(data), 'on disk');
    const back = await api.files.read(path, { format: 'bytes' });
    assert.instance(back, Uint8Array);
    assert.is(back.length, size);
    assert.is(sha(back), sha(data), 'read bytes');
    const stream = await api.files.read(path, { format: 'stream' });
    const h = createHash('sha256');
    let n = 0;
    for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) {
      h.update(chunk);
      n += chunk.length;
    }
    assert.is(n, size);
    assert.is(h.digest('hex'), sha(data), 'read stream');
    assert.is((await api.files.getInfo(path)).size, size);
  }
});

test('text, streams as input, and the array form', async () => {
  await api.files.write(join(dir, 't.txt'), 'héllo\n');
  assert.is(await api.files.read(join(dir, 't.txt')), 'héllo\n');
  const src = Readable.from((function* () {
    for (let i = 0; i < 100; i++) yield Buffer.from(`chunk ${i}\n`);
  })());
  await api.files.write(join(dir, 'streamed.txt'), src);
  const expected = Array.from({ length: 100 }, (_, i) => `chunk ${i}\n`).join('');
  assert.is(await api.files.read(join(dir, 'streamed.txt')), expected);
  const infos = await api.files.write([
    { path: join(dir, 'm1'), data: 'one' },
    { path: join(dir, 'm2'), data: new Uint8Array([50]) },
  ]);
  assert.equal(infos.map((i) => i.name), ['m1', 'm2']);
  assert.is(await api.files.read(join(dir, 'm2')), '2');
  await api.files.write(join(dir, 'mode'), 'x', { mode: 0o600 });
  assert.is((await api.files.getInfo(join(dir, 'mode'))).mode & 0o777, 0o600);
});

test('list with depth, getInfo, exists, makeDir, remove, rename', async () => {
  const root = join(dir, 'tree');
  assert.is(await api.files.makeDir(join(root, 'a', 'b', 'c')), true);
  assert.is(await api.files.makeDir(join(root, 'a')), false);
  await api.files.write(join(root, 'a', 'f1'), '12345');
  await api.files.write(join(root, 'a', 'b', 'f2'), '1');
  await api.files.write(join(root, 'a', 'b', 'c', 'f3'), '1');
  const d1 = await api.files.list(root);
  assert.equal(d1.map((e) => e.name), ['a']);
  assert.is(d1[0]!.type, 'dir');
  assert.is(d1[0]!.path, join(root, 'a'));
  const d2 = (await api.files.list(root, { depth: 2 })).map((e) => e.path).sort();
  assert.equal(d2, [join(root, 'a'), join(root, 'a', 'b'), join(root, 'a', 'f1')]);
  const d4 = (await api.files.list(root, { depth: 4 })).map((e) => e.path.slice(root.length)).sort();
  assert.equal(d4, ['/a', '/a/b', '/a/b/c', '/a/b/c/f3', '/a/b/f2', '/a/f1']);
  const info = await api.files.getInfo(join(root, 'a', 'f1'));
  assert.is(info.type, 'file');
  assert.is(info.size, 5);
  assert.is(info.name, 'f1');
  assert.ok(Math.abs(info.modifiedTime.getTime() - Date.now()) < 60_000);
  assert.is(await api.files.exists(join(root, 'a', 'f1')), true);
  assert.is(await api.files.exists(join(root, 'nope')), false);
  const moved = await api.files.rename(join(root, 'a', 'f1'), join(root, 'moved'));
  assert.is(moved.path, join(root, 'moved'));
  assert.is(await api.files.exists(join(root, 'a', 'f1')), false);
  assert.is(await api.files.read(join(root, 'moved')), '12345');
  await api.files.remove(join(root, 'a'));
  assert.is(await api.files.exists(join(root, 'a')), false);
  assert.equal((await api.files.list(root)).map((e) => e.name), ['moved']);
});

test('FILE_NOT_FOUND and other errors carry codes', async () => {
  const missing = await api.files.read(join(dir, 'missing')).catch((e) => e);
  assert.instance(missing, FileNotFoundError);
  assert.is(missing.code, 'FILE_NOT_FOUND');
  assert.ok(code('FILE_NOT_FOUND')(await api.files.list(join(dir, 'missing')).catch((e) => e)));
  assert.ok(code('FILE_NOT_FOUND')(await api.files.rename(join(dir, 'missing'), join(dir, 'x')).catch((e) => e)));
  await api.files.write(join(dir, 'plain'), 'x');
  assert.ok(code('NOT_A_DIRECTORY')(await api.files.write(join(dir, 'plain', 'child'), 'x').catch((e) => e)));
  assert.ok(code('IS_A_DIRECTORY')(await api.files.read(dir).catch((e) => e)));
  assert.ok(code('INVALID_ARGUMENT')(await api.files.read('').catch((e) => e)));
  assert.ok(code('INVALID_ARGUMENT')(await api.files.list(dir, { depth: 17 }).catch((e) => e)));
  assert.ok(code('INVALID_ARGUMENT')(await api.files.write(join(dir, 'x'), 42 as never).catch((e) => e)));
});

testUnless('api-files', isRoot ? null : 'needs root to start an agent as nobody', 'root')('permission errors (agent running as nobody)', async () => {
  const nobody = await hostApi({ uid: 65534, gid: 65534 });
  try {
    const secret = join(dir, 'secret');
    await api.files.write(secret, 'root only', { mode: 0o600 });
    await chmod(dir, 0o755);
    assert.ok(code('PERMISSION_DENIED')(await nobody.files.read(secret).catch((e) => e)));
    assert.ok(code('PERMISSION_DENIED')(await nobody.files.write('/root/torpor-denied', 'x').catch((e) => e)));
    assert.ok(code('PERMISSION_DENIED')(await nobody.files.remove(secret).catch((e) => e)));
    const r = await nobody.commands.run(['id', '-u']);
    assert.is(r.stdout.trim(), '65534');
  } finally {
    await nobody.close();
  }
});

test('a file whose stat size is not its length: /proc (size 0) reads whole', async () => {
  const status = await api.files.read('/proc/self/status');
  assert.match(status, /^Name:\ttorpor-agent/);
});

/** A sysfs attribute (stat size 4096, shorter content) present on this host, if any. */
const sysPath = ['/sys/kernel/mm/transparent_hugepage/enabled', '/sys/kernel/uevent_seqnum', '/sys/power/state'].find((p) => existsSync(p));

testUnless('api-files', sysPath ? null : 'this host has none of the sysfs files the test reads', 'host')(
  'a file whose stat size is not its length: /sys (size 4096) reads whole',
  async () => {
    assert.is(await api.files.read(sysPath!), await readFile(sysPath!, 'utf8'));
  },
);

test('an empty directory lists as []', async () => {
  const empty = join(dir, 'empty-dir');
  assert.is(await api.files.makeDir(empty), true);
  assert.equal(await api.files.list(empty), []);
  assert.equal(await api.files.list(empty, { depth: 4 }), []);
});

test('write creates missing parent directories (mkdir -p), and a file in the way is NOT_A_DIRECTORY', async () => {
  const deep = join(dir, 'p', 'q', 'r', 'f.txt');
  await api.files.write(deep, 'deep');
  assert.is(await readFile(deep, 'utf8'), 'deep');
  assert.is((await api.files.getInfo(join(dir, 'p', 'q'))).type, 'dir');
  await api.files.write(join(dir, 'plain'), 'x');
  const err = await api.files.write(join(dir, 'plain', 'sub', 'f'), 'y').catch((e) => e);
  assert.ok(code('NOT_A_DIRECTORY')(err), String(err));
});

test.run();
