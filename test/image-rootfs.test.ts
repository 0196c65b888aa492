// An image's layers as a bootable ext4 (lib/image/flatten.ts, ext4.ts, rootfs.ts):
// layer tarballs built here, flattened with the OCI whiteout rules, made into an
// ext4 by mke2fs -d (no root), and read back WITHOUT mounting through debugfs.
// No KVM needed; one test runs the whole pipeline as an ordinary user (nobody).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { gzipSync } from 'node:zlib';

import * as tar from 'tar-stream';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { checkMke2fs, superblock } from '../lib/image/ext4.js';
import { flattenLayers, normalisePath } from '../lib/image/flatten.js';
import { imageRootfs, imageRootfsDir } from '../lib/image/rootfs.js';
import type { PulledImage } from '../lib/image/types.js';
import { needsCommands, testUnless } from './skip-unless.js';

const FILE = 'image-rootfs';

/** Why mke2fs cannot build from a tarball here (absent, older than 1.47.1), or null. */
function needsMke2fs(): string | null {
  // e2fsprogs' tools answer -V, not --version (so not needsCommands).
  const missing = ['debugfs', 'e2fsck', 'dumpe2fs'].filter((t) => spawnSync(t, ['-V'], { stdio: 'ignore', env: { ...process.env, PATH: `${process.env.PATH}:/usr/sbin:/sbin` } }).status !== 0);
  if (missing.length) return `needs ${missing.join(' and ')} (e2fsprogs)`;
  try {
    checkMke2fs();
    return null;
  } catch (err) {
    return (err as Error).message;
  }
}

/** Why this process cannot run a command as nobody (setpriv), or null. */
function needsUserSwitch(): string | null {
  if (process.getuid?.() !== 0) return 'needs root to switch to an ordinary user (nobody) for the no-root run';
  return spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'true']).status === 0 ? null : 'needs setpriv';
}

const mke2fsReason = needsMke2fs();
const ext4Test = testUnless(FILE, mke2fsReason, 'tools');
const nobodyTest = testUnless(FILE, mke2fsReason ?? needsUserSwitch(), mke2fsReason ? 'tools' : 'root');

type Spec = Partial<tar.Header> & { name: string; data?: string; xattrs?: Record<string, Buffer> };

/**
 * A layer tarball. xattrs become SCHILY.xattr.* PAX records byte for byte:
 * tar-stream writes PAX values as UTF-8 text, so each value goes in as an ASCII
 * placeholder of the same length and the bytes are swapped in afterwards (a
 * PAX header's data has no checksum).
 */
async function layer(entries: Spec[]): Promise<Buffer> {
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  const collected = (async () => {
    for await (const c of pack) chunks.push(c as Buffer);
  })();
  const swaps: Array<[Buffer, Buffer]> = [];
  for (const { data, xattrs, ...h } of entries) {
    let pax: Record<string, string> | undefined;
    for (const [name, value] of Object.entries(xattrs ?? {})) {
      const placeholder = `@${swaps.length}@`.padEnd(value.length, '#');
      assert.is(placeholder.length, value.length, 'xattr values in the fixture are at least 4 bytes');
      swaps.push([Buffer.from(`SCHILY.xattr.${name}=${placeholder}\n`), Buffer.concat([Buffer.from(`SCHILY.xattr.${name}=`), value, Buffer.from('\n')])]);
      (pax ??= {})[`SCHILY.xattr.${name}`] = placeholder;
    }
    await new Promise<void>((resolve, reject) =>
      pack.entry({ mtime: T1, uid: 0, gid: 0, ...h, ...(pax ? { pax } : {}) } as tar.Header, data as string, (err) => (err ? reject(err) : resolve())),
    );
  }
  pack.finalize();
  await collected;
  const out = Buffer.concat(chunks);
  for (const [from, to] of swaps) {
    const at = out.indexOf(from);
    assert.ok(at >= 0, 'placeholder found');
    to.copy(out, at);
  }
  return out;
}

const T1 = new Date(1_700_000_000_000);
const T2 = new Date(1_710_000_000_000);
// security.capability v2, cap_net_raw + cap_setuid permitted and effective: bytes over 0x7f on purpose.
const CAPS = Buffer.from('0100000280200000000000000000000000000000', 'hex');

async function fixtureLayers(): Promise<{ lower: Buffer; upper: Buffer; top: Buffer }> {
  const lower = await layer([
    { name: './etc/', type: 'directory', mode: 0o755 },
    { name: './etc/passwd', mode: 0o644, data: 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n' },
    { name: './etc/gone', mode: 0o644, data: 'deleted above' },
    { name: './etc/sub/', type: 'directory', mode: 0o755 },
    { name: './etc/sub/deep', mode: 0o644, data: 'deleted with its directory' },
    { name: './etc/localtime', type: 'symlink', linkname: '/usr/share/zoneinfo/UTC', mode: 0o777 },
    { name: './opq/', type: 'directory', mode: 0o755 },
    { name: './opq/lower1', mode: 0o644, data: 'hidden' },
    { name: './opq/lowerdir/', type: 'directory', mode: 0o755 },
    { name: './opq/lowerdir/x', mode: 0o644, data: 'hidden too' },
    { name: './bin/', type: 'directory', mode: 0o755 },
    { name: './bin/su', mode: 0o4755, data: 'SUID' },
    { name: './bin/sgid', mode: 0o2755, gid: 42, data: 'SGID' },
    { name: './bin/orig', mode: 0o755, data: 'ORIG' },
    { name: './bin/alias', type: 'link', linkname: './bin/orig', mode: 0o755 },
    { name: './bin/tool', mode: 0o755, data: 'TOOL' },
    { name: './bin/tool2', type: 'link', linkname: 'bin/tool', mode: 0o755 },
    { name: './bin/replaced', mode: 0o755, data: 'v1' },
    { name: './dev/', type: 'directory', mode: 0o755 },
    { name: './dev/null', type: 'character-device', devmajor: 1, devminor: 3, mode: 0o666 },
    { name: './dev/fifo', type: 'fifo', mode: 0o600 },
    { name: './home/', type: 'directory', mode: 0o755 },
    { name: './home/user/', type: 'directory', mode: 0o750, uid: 1000, gid: 1000 },
    { name: './home/user/secret', mode: 0o640, uid: 1000, gid: 1000, data: 'only for user' },
    { name: './tmp/', type: 'directory', mode: 0o1777 },
    { name: './usr/', type: 'directory', mode: 0o755 },
    { name: './usr/bin/', type: 'directory', mode: 0o755 },
    { name: './usr/bin/ping', mode: 0o755, data: 'PING', xattrs: { 'security.capability': CAPS } },
    { name: './usr/bin/marked', mode: 0o644, data: 'M', xattrs: { 'user.note': Buffer.from('hi there') } },
  ]);
  const upper = await layer([
    { name: 'etc/', type: 'directory', mode: 0o700, mtime: T2 },
    { name: 'etc/.wh.gone', data: '' },
    { name: 'etc/.wh.sub', data: '' },
    { name: 'opq/.wh..wh..opq', data: '' },
    { name: 'opq/upper', mode: 0o644, data: 'UP' },
    { name: 'bin/orig', mode: 0o755, data: 'NEW' },
    { name: 'bin/replaced', mode: 0o700, uid: 7, gid: 8, data: 'v2' },
  ]);
  // A whiteout for something no layer has, and a file whose parent no layer names.
  const top = await layer([
    { name: 'etc/.wh.never-there', data: '' },
    { name: 'srv/data/file', mode: 0o600, data: 'implicit parents' },
  ]);
  return { lower, upper, top };
}

function digest(buf: Buffer): string {
  return `sha256:${createHash('sha256').update(buf).digest('hex')}`;
}

/** The fixture as a PulledImage under `dir`: the bottom layer gzip'd, the others plain tar. */
async function fixtureImage(dir: string): Promise<PulledImage> {
  const { lower, upper, top } = await fixtureLayers();
  const blobs: Array<[Buffer, string]> = [
    [gzipSync(lower), 'application/vnd.oci.image.layer.v1.tar+gzip'],
    [upper, 'application/vnd.oci.image.layer.v1.tar'],
    [top, 'application/vnd.docker.image.rootfs.diff.tar'],
  ];
  const layers = [];
  for (const [blob, mediaType] of blobs) {
    const d = digest(blob);
    const path = join(dir, d.slice(7));
    await writeFile(path, blob, { mode: 0o644 });
    layers.push({ digest: d, mediaType, size: blob.length, path });
  }
  return {
    source: 'test:fixture',
    manifestDigest: digest(Buffer.from('manifest')),
    configDigest: digest(Buffer.from(JSON.stringify(layers.map((l) => l.digest)))),
    config: { architecture: 'amd64', os: 'linux', env: [], workingDir: '', user: '', entrypoint: [], cmd: ['/bin/sh'] },
    layers,
  };
}

function debugfs(image: string, request: string): string {
  const r = spawnSync('debugfs', ['-R', request, image], { encoding: 'utf8' });
  return (r.stdout ?? '') + (r.stderr ?? '');
}

function inodeOf(image: string, path: string): number {
  const m = /Inode: (\d+)/.exec(debugfs(image, `stat ${path}`));
  assert.ok(m, `${path} is in the image`);
  return Number(m[1]);
}

function cat(image: string, path: string): string {
  return spawnSync('debugfs', ['-R', `cat ${path}`, image], { encoding: 'utf8' }).stdout;
}

/** The names in a directory (debugfs ls -p: /inode/mode/uid/gid/name/size/ per line). */
function names(image: string, dir: string): string[] {
  return spawnSync('debugfs', ['-R', `ls -p ${dir}`, image], { encoding: 'utf8' })
    .stdout.split('\n')
    .map((line) => line.split('/')[5])
    .filter((n): n is string => n !== undefined && n !== '' && n !== '.' && n !== '..')
    .sort();
}

async function fakeAgent(dir: string): Promise<{ path: string; sha256: string }> {
  const path = join(dir, 'torpor-agent');
  const bytes = Buffer.concat([Buffer.from('\x7fELF fake agent for the image test\n'), Buffer.alloc(9000, 7)]);
  await writeFile(path, bytes, { mode: 0o755 });
  return { path, sha256: createHash('sha256').update(bytes).digest('hex') };
}

/** A Writable that keeps what is written (a flatten output in memory). */
function memorySink(): { out: Writable; bytes: () => Buffer } {
  const chunks: Buffer[] = [];
  return {
    out: new Writable({
      write(chunk: Buffer, _enc, cb) {
        chunks.push(chunk);
        cb();
      },
    }),
    bytes: () => Buffer.concat(chunks),
  };
}

async function listTar(buf: Buffer): Promise<tar.Header[]> {
  const extract = tar.extract();
  const headers: tar.Header[] = [];
  const done = (async () => {
    for await (const e of extract) {
      headers.push(e.header);
      e.resume();
    }
  })();
  extract.end(buf);
  await done;
  return headers;
}

async function expectInvalid(p: Promise<unknown>, pattern: RegExp): Promise<void> {
  try {
    await p;
  } catch (err) {
    assert.instance(err, TorporError);
    assert.is((err as TorporError).code, 'IMAGE_INVALID', (err as Error).message);
    assert.match((err as Error).message, pattern);
    return;
  }
  assert.unreachable('expected IMAGE_INVALID');
}

test('paths are normalised and `..` is refused', () => {
  assert.is(normalisePath('./a//b/./c/'), 'a/b/c');
  assert.is(normalisePath('/abs/x'), 'abs/x');
  assert.is(normalisePath('./'), '');
  assert.is(normalisePath('../escape'), null);
  assert.is(normalisePath('a/../../b'), null);
});

test('flatten: whiteouts, opaque directories, replaced files, link copies; parents and link targets first', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-flatten-'));
  try {
    const image = await fixtureImage(dir);
    const { out, bytes } = memorySink();
    const stats = await flattenLayers(image.layers, out);
    const headers = await listTar(bytes());
    const byName = new Map(headers.map((h) => [h.name.replace(/\/$/, ''), h]));
    for (const gone of ['etc/gone', 'etc/sub', 'etc/sub/deep', 'opq/lower1', 'opq/lowerdir', 'opq/lowerdir/x']) {
      assert.not.ok(byName.has(gone), `${gone} is whited out`);
    }
    assert.not.ok(headers.some((h) => h.name.includes('.wh.')), 'no whiteout file in the output');
    assert.is(byName.get('etc')!.mode, 0o700, "etc has the upper layer's mode");
    assert.is(byName.get('etc')!.mtime.getTime(), T2.getTime());
    assert.is(byName.get('bin/replaced')!.uid, 7);
    assert.is(byName.get('srv')!.type, 'directory', 'a parent no layer names is made');
    // Every entry's parent precedes it; every hard link's target precedes it.
    const seen = new Set<string>(['']);
    for (const h of headers) {
      const name = h.name.replace(/\/$/, '');
      assert.ok(seen.has(name.split('/').slice(0, -1).join('/')), `parent of ${name} first`);
      if (h.type === 'link') assert.ok(seen.has(h.linkname!), `target of ${name} first`);
      seen.add(name);
    }
    assert.is(byName.get('bin/tool2')!.type, 'link');
    assert.is(byName.get('bin/tool2')!.linkname, 'bin/tool');
    assert.is(byName.get('bin/alias')!.type, 'file', 'a link whose target was replaced becomes a copy');
    assert.is(stats.linkCopies, 1);
    assert.is(stats.hardlinks, 1);
    assert.is(stats.whiteouts, 4);
    assert.is(stats.layersReread, 3);
    assert.equal(stats.xattrs.find((x) => x.name === 'security.capability')?.value, CAPS);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

ext4Test('imageRootfs: an ext4 read back without mounting keeps ownership, modes, links, devices, xattrs; agent in place', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-image-rootfs-'));
  try {
    const image = await fixtureImage(dir);
    const agent = await fakeAgent(dir);
    const home = join(dir, 'home');
    const events: string[] = [];
    const started = performance.now();
    const result = await imageRootfs(image, { home, agent, onProgress: (p) => events.push(p.phase) });
    const firstMs = performance.now() - started;
    const img = result.path;
    assert.ok(img.startsWith(join(imageRootfsDir(home))), img);
    assert.ok(events.includes('unpack') && events.includes('ext4'), events.join(','));

    const fsck = spawnSync('e2fsck', ['-fn', img], { encoding: 'utf8' });
    assert.is(fsck.status, 0, `e2fsck -fn: ${fsck.stdout}${fsck.stderr}`);

    const st = (p: string): string => debugfs(img, `stat ${p}`);
    assert.match(st('/bin/su'), /Mode:\s+04755/);
    assert.match(st('/bin/su'), /User:\s+0\s+Group:\s+0/);
    assert.match(st('/bin/sgid'), /Mode:\s+02755/);
    assert.match(st('/bin/sgid'), /Group:\s+42\b/);
    assert.match(st('/home/user/secret'), /Mode:\s+0640/);
    assert.match(st('/home/user/secret'), /User:\s+1000\s+Group:\s+1000/);
    assert.is(cat(img, '/home/user/secret'), 'only for user');
    assert.match(st('/home/user'), /Mode:\s+0750/);
    assert.match(st('/tmp'), /Mode:\s+01777/);
    assert.match(st('/etc'), /Mode:\s+0700/);
    assert.match(st('/etc'), new RegExp(`mtime: 0x${(T2.getTime() / 1000).toString(16)}`));
    assert.match(st('/dev/null'), /Type: character special/);
    assert.match(st('/dev/null'), /Device major\/minor number: 01:03/);
    assert.match(st('/dev/fifo'), /Type: FIFO/);
    assert.match(st('/etc/localtime'), /Type: symlink/);
    assert.match(st('/etc/localtime'), /Fast link dest: "\/usr\/share\/zoneinfo\/UTC"/);

    // Whiteouts honoured, the opaque directory lists only the upper layer's children.
    assert.match(st('/etc/gone'), /not found/);
    assert.match(st('/etc/sub'), /not found/);
    assert.equal(names(img, '/opq'), ['upper']);
    assert.equal(names(img, '/etc'), ['localtime', 'passwd']);
    assert.is(cat(img, '/bin/replaced'), 'v2');
    assert.match(st('/bin/replaced'), /Mode:\s+0700/);
    assert.match(st('/bin/replaced'), /User:\s+7\s+Group:\s+8/);
    assert.is(cat(img, '/srv/data/file'), 'implicit parents');

    // Hard links: one inode, two links; a link whose target was replaced keeps the old data.
    assert.is(inodeOf(img, '/bin/tool'), inodeOf(img, '/bin/tool2'));
    assert.match(st('/bin/tool'), /Links: 2/);
    assert.is(cat(img, '/bin/tool2'), 'TOOL');
    assert.is(cat(img, '/bin/orig'), 'NEW');
    assert.is(cat(img, '/bin/alias'), 'ORIG');
    assert.match(st('/bin/alias'), /Links: 1/);

    // xattrs: the binary capability byte for byte, a user.* one through debugfs ea_set.
    const caps = debugfs(img, 'ea_list /usr/bin/ping');
    assert.match(caps, new RegExp(`security\\.capability \\(20\\) = ${CAPS.toString('hex').replace(/(..)(?!$)/g, '$1 ')}`), caps);
    assert.match(debugfs(img, 'ea_list /usr/bin/marked'), /user\.note \(8\) = "hi there"/);

    // The boot directories and the agent, as add-agent.sh writes it.
    for (const d of ['/proc', '/sys', '/dev', '/run', '/tmp', '/usr/sbin']) assert.match(st(d), /Type: directory/, d);
    const agentStat = st('/usr/sbin/torpor-agent');
    assert.match(agentStat, /Mode:\s+0755/);
    assert.match(agentStat, /User:\s+0\s+Group:\s+0/);
    const dumped = join(dir, 'agent-back');
    debugfs(img, `dump /usr/sbin/torpor-agent ${dumped}`);
    assert.equal(await readFile(dumped), await readFile(agent.path));

    // At least 1 GiB free by default, in a sparse file; read-only in the store.
    const sb = superblock(img);
    assert.ok(sb.freeBlocks * sb.blockSize >= 1024 * 1048576, `free ${sb.freeBlocks * sb.blockSize}`);
    const fileStat = await stat(img);
    assert.is(fileStat.size, result.sizeMiB * 1048576);
    assert.ok(fileStat.blocks * 512 < 200 * 1048576, `sparse: ${fileStat.blocks * 512} bytes on disk`);
    assert.is(fileStat.mode & 0o777, 0o444);
    assert.ok(result.contentBytes > 0);

    // Cached: the second call finds it without building.
    const t2 = performance.now();
    const again = await imageRootfs(image, { home, agent });
    assert.equal(again, result);
    assert.ok(performance.now() - t2 < Math.max(200, firstMs / 4), 'cached');
    // Another size is another image.
    const sized = await imageRootfs(image, { home, agent, sizeMiB: 200 });
    assert.is.not(sized.path, result.path);
    assert.is((await stat(sized.path)).size, 200 * 1048576);
    const sizedSb = superblock(sized.path);
    assert.ok(sizedSb.freeBlocks * sizedSb.blockSize > 100 * 1048576);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

ext4Test('UTF-8 names and link targets survive a C locale (the nested host has no other)', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-image-utf8-'));
  const saved = process.env.LC_ALL;
  process.env.LC_ALL = 'C';
  try {
    const agent = await fakeAgent(dir);
    const blob = await layer([
      { name: 'usr/', type: 'directory', mode: 0o755 },
      { name: 'usr/share/', type: 'directory', mode: 0o755 },
      { name: 'usr/share/café.txt', data: 'crème\n', mode: 0o644 },
      { name: 'usr/share/naïve-link', type: 'symlink', linkname: 'café.txt' },
      { name: 'usr/share/hård', type: 'link', linkname: 'usr/share/café.txt' },
    ]);
    const path = join(dir, 'layer');
    await writeFile(path, blob);
    const image: PulledImage = {
      source: 'test:utf8',
      manifestDigest: digest(Buffer.from('utf8-manifest')),
      configDigest: digest(blob),
      config: { architecture: 'amd64', os: 'linux', env: [], workingDir: '', user: '', entrypoint: [], cmd: [] },
      layers: [{ digest: digest(blob), mediaType: 'application/vnd.oci.image.layer.v1.tar', size: blob.length, path }],
    };
    const { path: img } = await imageRootfs(image, { home: join(dir, 'home'), agent });
    assert.is(cat(img, '/usr/share/café.txt'), 'crème\n');
    assert.is(inodeOf(img, '/usr/share/hård'), inodeOf(img, '/usr/share/café.txt'));
    assert.match(debugfs(img, 'stat /usr/share/naïve-link'), /Fast link dest: "café.txt"/);
  } finally {
    if (saved === undefined) delete process.env.LC_ALL;
    else process.env.LC_ALL = saved;
    await rm(dir, { recursive: true, force: true });
  }
});

ext4Test('bad layers are IMAGE_INVALID and leave nothing in the store; a later good build succeeds', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-image-bad-'));
  try {
    const agent = await fakeAgent(dir);
    const home = join(dir, 'home');
    const good = await fixtureImage(dir);
    const bad = async (name: string, blob: Buffer, mediaType: string): Promise<PulledImage> => {
      const path = join(dir, name);
      await writeFile(path, blob);
      return { ...good, configDigest: digest(blob), layers: [{ digest: digest(blob), mediaType, size: blob.length, path }] };
    };
    const escape = await bad('escape', await layer([{ name: '../escape', data: 'x' }]), 'application/vnd.oci.image.layer.v1.tar');
    await expectInvalid(imageRootfs(escape, { home, agent }), /climbs out/);
    const linkOut = await bad('link-out', await layer([{ name: 'a', type: 'link', linkname: '../../etc/shadow' }]), 'application/vnd.oci.image.layer.v1.tar');
    await expectInvalid(imageRootfs(linkOut, { home, agent }), /climbs out/);
    const dangling = await bad('dangling', await layer([{ name: 'a', type: 'link', linkname: 'nothing' }]), 'application/vnd.oci.image.layer.v1.tar');
    await expectInvalid(imageRootfs(dangling, { home, agent }), /no such file/);
    const gz = gzipSync((await fixtureLayers()).lower);
    const truncated = await bad('truncated', gz.subarray(0, Math.floor(gz.length / 2)), 'application/vnd.oci.image.layer.v1.tar+gzip');
    await expectInvalid(imageRootfs(truncated, { home, agent }), /not a readable tar layer/);
    const notGzip = await bad('not-gzip', Buffer.from('plain text, not a layer'), 'application/vnd.oci.image.layer.v1.tar+gzip');
    await expectInvalid(imageRootfs(notGzip, { home, agent }), /not gzip/);
    const garbage = await bad('garbage', Buffer.alloc(4096, 0x41), 'application/vnd.oci.image.layer.v1.tar');
    await expectInvalid(imageRootfs(garbage, { home, agent }), /not a readable tar layer/);

    const left = (await readdir(imageRootfsDir(home))).filter((n) => !n.endsWith('.lock'));
    assert.equal(left, [], 'no directory left behind');

    // Too small a size is OUT_OF_SPACE, also leaving nothing.
    try {
      await imageRootfs(good, { home, agent, sizeMiB: 1 });
      assert.unreachable('a 1 MiB image');
    } catch (err) {
      assert.is((err as TorporError).code, 'OUT_OF_SPACE', (err as Error).message);
    }
    assert.equal((await readdir(imageRootfsDir(home))).filter((n) => !n.endsWith('.lock')), []);

    // A build killed half-way leaves a .tmp-<key>-<pid>- directory: swept once its pid is gone.
    await mkdir(join(imageRootfsDir(home), '.tmp-0123abcd-999999999-x'), { recursive: true });
    const ok = await imageRootfs(good, { home, agent });
    assert.ok((await stat(ok.path)).isFile());
    assert.equal((await readdir(imageRootfsDir(home))).filter((n) => !n.endsWith('.lock')).length, 1);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

ext4Test('zstd layers go through the zstd program', async () => {
  const reason = needsCommands('zstd');
  if (reason) {
    // zstd missing: the message says what to install.
    const dir = await mkdtemp(join(tmpdir(), 'torpor-zstd-'));
    try {
      const path = join(dir, 'l');
      await writeFile(path, Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0]));
      await expectInvalid(flattenLayers([{ path, mediaType: 'application/vnd.oci.image.layer.v1.tar+zstd' }], memorySink().out), /zstd/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    return;
  }
  const dir = await mkdtemp(join(tmpdir(), 'torpor-zstd-'));
  try {
    const plain = join(dir, 'l.tar');
    await writeFile(plain, await layer([{ name: 'hello', mode: 0o644, data: 'zstd layer' }]));
    const z = spawnSync('zstd', ['-q', '-o', `${plain}.zst`, plain]);
    assert.is(z.status, 0);
    const { out, bytes } = memorySink();
    await flattenLayers([{ path: `${plain}.zst`, mediaType: 'application/vnd.oci.image.layer.v1.tar+zstd' }], out);
    const headers = await listTar(bytes());
    assert.equal(headers.map((h) => h.name), ['hello']);
    // A truncated zstd layer fails as a bad layer.
    const full = await readFile(`${plain}.zst`);
    await writeFile(`${plain}.zst`, full.subarray(0, full.length - 8));
    await expectInvalid(flattenLayers([{ path: `${plain}.zst`, mediaType: 'application/vnd.oci.image.layer.v1.tar+zstd' }], memorySink().out), /zstd|tar/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('an mke2fs older than 1.47.1 is MISSING_TOOLS naming the fix', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-mke2fs-'));
  const savedPath = process.env.PATH;
  try {
    await writeFile(join(dir, 'mke2fs'), '#!/bin/sh\necho "mke2fs 1.47.0 (5-Feb-2023)" >&2\n', { mode: 0o755 });
    process.env.PATH = `${dir}:${savedPath}`;
    try {
      checkMke2fs();
      assert.unreachable('1.47.0 accepted');
    } catch (err) {
      assert.is((err as TorporError).code, 'MISSING_TOOLS');
      assert.match((err as Error).message, /1\.47\.1.*1\.47\.0.*bookworm-backports/s);
    }
  } finally {
    process.env.PATH = savedPath;
    await rm(dir, { recursive: true, force: true });
  }
});

nobodyTest('the whole pipeline runs as an ordinary user (nobody), no root anywhere', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-image-nobody-'));
  try {
    await chmod(dir, 0o777);
    const image = await fixtureImage(dir);
    const agent = await fakeAgent(dir);
    const home = join(dir, 'home');
    const child = `
      const { imageRootfs } = await import(${JSON.stringify(new URL('../lib/image/rootfs.ts', import.meta.url).pathname)});
      const r = await imageRootfs(JSON.parse(process.env.IMAGE), { home: process.env.HOME_DIR, agent: JSON.parse(process.env.AGENT) });
      console.log(JSON.stringify({ uid: process.getuid(), ...r }));
    `;
    const r = spawnSync(
      'setpriv',
      ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '--import', 'tsx', '--input-type=module', '-e', child],
      {
        encoding: 'utf8',
        cwd: new URL('..', import.meta.url).pathname,
        env: { ...process.env, HOME: dir, IMAGE: JSON.stringify(image), AGENT: JSON.stringify(agent), HOME_DIR: home },
        timeout: 120_000,
      },
    );
    assert.is(r.status, 0, `child: ${r.stdout}${r.stderr}`);
    const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { uid: number; path: string };
    assert.is(out.uid, 65534);
    assert.is((await stat(out.path)).uid, 65534, 'built by nobody');
    const st = debugfs(out.path, 'stat /bin/su');
    assert.match(st, /Mode:\s+04755/);
    assert.match(st, /User:\s+0\s+Group:\s+0/, 'root-owned inside although built by nobody');
    assert.match(debugfs(out.path, 'stat /home/user/secret'), /User:\s+1000\s+Group:\s+1000/);
    assert.match(debugfs(out.path, 'stat /dev/null'), /Type: character special/);
    assert.match(debugfs(out.path, 'stat /usr/sbin/torpor-agent'), /User:\s+0\s+Group:\s+0/);
    assert.is(spawnSync('e2fsck', ['-fn', out.path]).status, 0);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test.run();
