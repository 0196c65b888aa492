// An image's layers, bottom first, flattened into ONE tar stream: what the
// image's root filesystem holds once every layer is applied with the OCI
// whiteout rules (image-spec layer.md):
//   `.wh.<name>`   deletes <name> (and what is below it) from the lower layers;
//   `.wh..wh..opq` makes its directory opaque: the lower layers' children are hidden;
// whiteouts apply to lower layers only, and never appear in the output.
//
// Two passes over the layers, never the file system (so no root is needed and
// ownership is kept as numbers):
//   pass 1 reads every layer's headers (data skipped) and builds the final tree:
//     one winning entry per path, with its header metadata;
//   pass 2 reads again only the layers that hold a winning regular file with
//     data, and copies those entries through.
// The output is written in an order any extractor (mke2fs -d) can apply front to
// back: every directory (parents first, each with the metadata of the highest
// layer that names it), then symlinks, devices, fifos and empty files, then the
// files with data, then hard links (whose targets all precede them).
//
// Hard links: a link refers to its target as it was when the link's layer was
// applied. When a later layer replaced or deleted that target but kept the
// link, the link's path becomes a regular copy of the old target (its data,
// mode, owner and xattrs; further links to the same old target link to that
// copy), as overlayfs would show it: the file the link named, not the new one.
//
// Kept from the headers: uid/gid numbers (uname/gname too, for show), modes with
// setuid/setgid/sticky, mtimes, symlink targets, device numbers, and PAX
// xattrs (SCHILY.xattr.*, binary values byte for byte). Paths are normalised
// (`./`, `/`, `//` and `.` stripped); `..` anywhere is IMAGE_INVALID.
import { spawn, spawnSync } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { open } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Readable, Writable } from 'node:stream';
import { createGunzip } from 'node:zlib';

import * as tar from 'tar-stream';

import { TorporError } from '../errors.js';

export interface LayerInput {
  path: string;
  mediaType: string;
  /** For messages ('sha256:...'); the path otherwise. */
  digest?: string;
}

export interface FlattenOptions {
  /** Directories the result must hold (created root:root when no layer has them). */
  ensureDirs?: Array<{ path: string; mode: number }>;
  onProgress?: (p: { pass: 1 | 2; layer: number; layers: number; bytes: number }) => void;
}

export interface FlattenStats {
  layers: number;
  /** Layers pass 2 had to read again (those holding winning file data). */
  layersReread: number;
  /** Entries in the output, by kind. */
  entries: number;
  directories: number;
  files: number;
  symlinks: number;
  hardlinks: number;
  /** Hard links whose target a later layer replaced or deleted, written as regular copies. */
  linkCopies: number;
  /** Devices and fifos. */
  specials: number;
  /** Whiteout entries applied (opaque markers included). */
  whiteouts: number;
  /** Bytes of file data in the output. */
  dataBytes: number;
  /** An upper bound on the ext4 blocks (4 KiB) the content needs: data, directories, long symlinks. */
  blocks4k: number;
  /** Every xattr in the output, by the path of its inode (a hard link's first name). */
  xattrs: Array<{ path: string; name: string; value: Buffer }>;
}

// ---------------------------------------------------------------------------
// PAX xattrs byte for byte: tar-stream decodes every PAX value as UTF-8, which
// mangles binary xattr values (security.capability). Its decodePax is wrapped
// so each header's pax object also carries the raw values of SCHILY.xattr.*
// records under a symbol (enumerable, so tar-stream's Object.assign with a
// global header keeps it); the string values it hands everyone else are unchanged.
const RAW_XATTRS = Symbol.for('torpor.rawXattrs');
{
  const require = createRequire(import.meta.url);
  const headers = require(join(dirname(require.resolve('tar-stream')), 'headers.js')) as {
    decodePax: ((buf: Uint8Array) => Record<string | symbol, unknown>) & { torporWrapped?: boolean };
  };
  if (!headers.decodePax.torporWrapped) {
    const original = headers.decodePax;
    const wrapped = (buf: Uint8Array): Record<string | symbol, unknown> => {
      const result = original(buf);
      const raw = rawPaxXattrs(Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength));
      if (raw.size) result[RAW_XATTRS] = raw;
      return result;
    };
    wrapped.torporWrapped = true;
    headers.decodePax = wrapped;
  }
}

/** The SCHILY.xattr.* records of a PAX extended header, values as raw bytes. */
function rawPaxXattrs(buf: Buffer): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  let at = 0;
  while (at < buf.length) {
    const space = buf.indexOf(0x20, at);
    if (space < 0) break;
    const len = parseInt(buf.toString('latin1', at, space), 10);
    if (!(len > 0) || at + len > buf.length) break;
    const record = buf.subarray(space + 1, at + len - 1); // without the trailing '\n'
    const eq = record.indexOf(0x3d);
    if (eq > 0) {
      const key = record.toString('utf8', 0, eq);
      if (key.startsWith('SCHILY.xattr.')) out.set(key.slice('SCHILY.xattr.'.length), Buffer.from(record.subarray(eq + 1)));
    }
    at += len;
  }
  return out;
}

// ---------------------------------------------------------------------------

type Kind = 'file' | 'directory' | 'symlink' | 'link' | 'character-device' | 'block-device' | 'fifo';

interface Entry {
  layer: number;
  /** Position among the layer's tar entries (pass 2 finds it again by it). */
  ordinal: number;
  path: string;
  kind: Kind;
  mode: number;
  uid: number;
  gid: number;
  uname: string;
  gname: string;
  /** Seconds; a PAX mtime string (fractions) is kept in paxMtime. */
  mtime: number;
  paxMtime?: string;
  size: number;
  /** Symlink target as written. */
  linkname: string;
  devmajor: number;
  devminor: number;
  xattrs?: Map<string, Buffer>;
  /** For a hard link: the entry (never a link, never a directory) it names. */
  source?: Entry;
}

interface Node {
  entry: Entry;
  children?: Map<string, Node>;
}

function invalid(layer: LayerInput, message: string, cause?: unknown): TorporError {
  return new TorporError('IMAGE_INVALID', `layer ${layer.digest ?? layer.path}: ${message}`, cause === undefined ? {} : { cause });
}

/** 'a/b/c' from './a//b/./c/', '' for the root; null when it climbs out (`..`). */
export function normalisePath(name: string): string | null {
  const parts: string[] = [];
  for (const part of name.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') return null;
    parts.push(part);
  }
  return parts.join('/');
}

let zstdAvailable: boolean | undefined;

/** The layer's tar bytes: gzip and zstd by their magic (checked against the media type), else plain tar. */
async function openLayer(layer: LayerInput): Promise<{ stream: Readable; done: () => Promise<void> }> {
  const fh = await open(layer.path, 'r').catch((err: unknown) => {
    throw new TorporError('IMAGE_INVALID', `layer ${layer.digest ?? layer.path}: cannot open ${layer.path}: ${(err as Error).message}`, { cause: err });
  });
  const magic = Buffer.alloc(4);
  try {
    await fh.read(magic, 0, 4, 0);
  } finally {
    await fh.close();
  }
  const gzip = magic[0] === 0x1f && magic[1] === 0x8b;
  const zstd = magic.readUInt32LE(0) === 0xfd2fb528;
  const media = layer.mediaType.toLowerCase();
  if (/gzip/.test(media) && !gzip) throw invalid(layer, `media type ${layer.mediaType} but the blob is not gzip data`);
  if (/zstd/.test(media) && !zstd) throw invalid(layer, `media type ${layer.mediaType} but the blob is not zstd data`);
  const file = createReadStream(layer.path, { highWaterMark: 1 << 20 });
  if (gzip) {
    const gunzip = createGunzip({ chunkSize: 1 << 18 });
    file.on('error', (err) => gunzip.destroy(err));
    file.pipe(gunzip);
    return { stream: gunzip, done: async () => {} };
  }
  if (zstd) {
    file.destroy();
    zstdAvailable ??= spawnSync('zstd', ['--version'], { stdio: 'ignore' }).status === 0;
    if (!zstdAvailable) {
      throw invalid(layer, 'zstd layers need the zstd program (apt-get install zstd); it is not installed on this host');
    }
    const child = spawn('zstd', ['-d', '-c', '-q', '--', layer.path], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-2000)));
    const exited = new Promise<number | string>((resolve) => child.on('close', (code, signal) => resolve(code ?? signal ?? -1)));
    child.on('error', (err) => child.stdout.destroy(err));
    return {
      stream: child.stdout,
      done: async () => {
        const code = await exited;
        if (code !== 0) throw invalid(layer, `zstd -d failed (${code}): ${stderr.trim()}`);
      },
    };
  }
  return { stream: file, done: async () => {} };
}

interface RawEntry {
  header: tar.Header;
  body: Readable;
}

/**
 * Calls `each` for every entry of one layer, in order. `each` must consume the
 * body (or return without touching it: it is drained). Errors in the data
 * (gzip, tar, a rejected path) become IMAGE_INVALID.
 */
async function readLayer(layer: LayerInput, each: (e: RawEntry, ordinal: number) => Promise<void>, onBytes?: (n: number) => void): Promise<void> {
  const { stream, done } = await openLayer(layer);
  const extract = tar.extract();
  stream.on('error', (err) => (extract as unknown as { destroy(e: Error): void }).destroy(err));
  if (onBytes) stream.on('data', (d: Buffer) => onBytes(d.length));
  stream.pipe(extract as unknown as NodeJS.WritableStream);
  let ordinal = 0;
  try {
    for await (const entry of extract) {
      const body = entry as unknown as Readable;
      await each({ header: entry.header, body }, ordinal++);
      // Whatever `each` left unread flows away (the next entry comes after it).
      body.resume();
    }
    await done();
  } catch (err) {
    stream.destroy();
    if (err instanceof TorporError) throw err;
    throw invalid(layer, `not a readable tar layer: ${(err as Error).message}`, err);
  }
}

const KINDS = new Set<string>(['file', 'contiguous-file', 'directory', 'symlink', 'link', 'character-device', 'block-device', 'fifo']);

function toEntry(layer: LayerInput, index: number, ordinal: number, header: tar.Header, path: string): Entry {
  if (!KINDS.has(header.type)) throw invalid(layer, `${header.name}: unsupported tar entry type '${header.type}'`);
  const kind = (header.type === 'contiguous-file' ? 'file' : header.type) as Kind;
  const pax = (header.pax ?? null) as (Record<string | symbol, unknown> & Record<string, string>) | null;
  const num = (key: string, fallback: number): number => {
    const v = pax?.[key];
    if (typeof v !== 'string') return fallback;
    const n = Number(v);
    if (!Number.isSafeInteger(n) || n < 0) throw invalid(layer, `${header.name}: bad PAX ${key}=${v}`);
    return n;
  };
  const e: Entry = {
    layer: index,
    ordinal,
    path,
    kind,
    mode: header.mode & 0o7777,
    uid: num('uid', header.uid),
    gid: num('gid', header.gid),
    uname: pax?.uname ?? header.uname ?? '',
    gname: pax?.gname ?? header.gname ?? '',
    mtime: Math.floor(header.mtime.getTime() / 1000),
    size: kind === 'file' ? header.size : 0,
    linkname: header.linkname ?? '',
    devmajor: header.devmajor ?? 0,
    devminor: header.devminor ?? 0,
  };
  if (typeof pax?.mtime === 'string' && /^-?\d+(\.\d+)?$/.test(pax.mtime)) {
    e.paxMtime = pax.mtime;
    e.mtime = Math.floor(Number(pax.mtime));
  }
  const raw = pax?.[RAW_XATTRS] as Map<string, Buffer> | undefined;
  if (raw?.size) e.xattrs = raw;
  return e;
}

const ROOT_ENTRY = (): Entry => ({
  layer: -1, ordinal: -1, path: '', kind: 'directory', mode: 0o755, uid: 0, gid: 0, uname: 'root', gname: 'root',
  mtime: 0, size: 0, linkname: '', devmajor: 0, devminor: 0,
});

function implicitDir(path: string, mtime: number, mode = 0o755): Entry {
  return { ...ROOT_ENTRY(), path, mtime, mode };
}

class Tree {
  readonly root: Node = { entry: ROOT_ENTRY(), children: new Map() };

  lookup(path: string): Node | undefined {
    if (path === '') return this.root;
    let node: Node | undefined = this.root;
    for (const part of path.split('/')) {
      node = node.children?.get(part);
      if (!node) return undefined;
    }
    return node;
  }

  /** The directory node that holds `path` (parents created as implicit directories), or a message why not. */
  parentFor(path: string, mtime: number): { node: Node; name: string } | string {
    const parts = path.split('/');
    const name = parts.pop()!;
    let node = this.root;
    let at = '';
    for (const part of parts) {
      at = at ? `${at}/${part}` : part;
      let next = node.children!.get(part);
      if (!next) {
        next = { entry: implicitDir(at, mtime), children: new Map() };
        node.children!.set(part, next);
      } else if (!next.children) {
        return `${path}: ${at} is not a directory in a lower layer`;
      }
      node = next;
    }
    return { node, name };
  }
}

/** One PAX record: '<len> key=value\n', the length counting itself. */
function paxRecord(key: string, value: Buffer | string): Buffer {
  const body = Buffer.concat([Buffer.from(` ${key}=`), typeof value === 'string' ? Buffer.from(value) : value, Buffer.from('\n')]);
  let len = body.length + 1;
  while (String(len).length + body.length > len) len++;
  return Buffer.concat([Buffer.from(String(len)), body]);
}

const TYPEFLAG: Record<Kind, string> = {
  file: '0', link: '1', symlink: '2', 'character-device': '3', 'block-device': '4', directory: '5', fifo: '6',
};

function ustarHeader(f: { name: string; mode: number; uid: number; gid: number; size: number; mtime: number; type: string; linkname: string; uname: string; gname: string; devmajor: number; devminor: number }): Buffer {
  const buf = Buffer.alloc(512);
  const str = (s: string, off: number, len: number): void => {
    buf.write(s, off, Math.min(len, Buffer.byteLength(s)), 'utf8');
  };
  const oct = (n: number, off: number, len: number): void => {
    const s = Math.max(0, Math.min(n, 8 ** (len - 1) - 1)).toString(8).padStart(len - 1, '0');
    buf.write(s, off, len - 1, 'ascii');
  };
  str(f.name, 0, 100);
  oct(f.mode, 100, 8);
  oct(f.uid, 108, 8);
  oct(f.gid, 116, 8);
  oct(f.size, 124, 12);
  oct(f.mtime, 136, 12);
  buf.fill(0x20, 148, 156);
  buf.write(f.type, 156, 1, 'ascii');
  str(f.linkname, 157, 100);
  buf.write('ustar\0' + '00', 257, 8, 'latin1');
  str(f.uname, 265, 32);
  str(f.gname, 297, 32);
  oct(f.devmajor, 329, 8);
  oct(f.devminor, 337, 8);
  let sum = 0;
  for (let i = 0; i < 512; i++) sum += buf[i]!;
  buf.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8, 'ascii');
  return buf;
}

const MAX_OCTAL_7 = 0o7777777;
const MAX_OCTAL_11 = 0o77777777777;

/** The header block(s) of one output entry: a PAX extended header first when a field does not fit ustar. */
function encodeEntry(e: Entry, path: string, kind: Kind, linkname: string): Buffer {
  const name = kind === 'directory' ? `${path}/` : path;
  const records: Buffer[] = [];
  const ascii = (s: string): boolean => /^[\x20-\x7e]*$/.test(s);
  if (Buffer.byteLength(name) > 100 || !ascii(name)) records.push(paxRecord('path', name));
  // A link target that fits goes into ustar's field as its UTF-8 bytes, without a PAX linkpath:
  // mke2fs 1.47.2 (libarchive) drops a hard link whose target comes only from a PAX linkpath
  // ("ignoring entry", then "File not found by ext2_lookup"), while it reads the raw field.
  const linkFits = Buffer.byteLength(linkname) <= 100;
  if (!linkFits) records.push(paxRecord('linkpath', linkname));
  if (e.uid > MAX_OCTAL_7) records.push(paxRecord('uid', String(e.uid)));
  if (e.gid > MAX_OCTAL_7) records.push(paxRecord('gid', String(e.gid)));
  const size = kind === 'file' ? e.size : 0;
  if (size > MAX_OCTAL_11) records.push(paxRecord('size', String(size)));
  if (e.paxMtime !== undefined || e.mtime < 0 || e.mtime > MAX_OCTAL_11) records.push(paxRecord('mtime', e.paxMtime ?? String(e.mtime)));
  if (e.xattrs) for (const [k, v] of e.xattrs) records.push(paxRecord(`SCHILY.xattr.${k}`, v));
  const main = ustarHeader({
    name: ascii(name) ? name : '', mode: e.mode, uid: e.uid, gid: e.gid, size, mtime: e.mtime, type: TYPEFLAG[kind],
    linkname: linkFits ? linkname : '', uname: e.uname, gname: e.gname, devmajor: e.devmajor, devminor: e.devminor,
  });
  if (!records.length) return main;
  const pax = Buffer.concat(records);
  const paxHead = ustarHeader({
    name: `PaxHeaders/${ascii(name) ? name : 'entry'}`.slice(0, 99), mode: 0o644, uid: 0, gid: 0, size: pax.length, mtime: Math.max(0, Math.min(e.mtime, MAX_OCTAL_11)),
    type: 'x', linkname: '', uname: '', gname: '', devmajor: 0, devminor: 0,
  });
  return Buffer.concat([paxHead, pax, Buffer.alloc((512 - (pax.length % 512)) % 512), main]);
}

/** Writes to a Writable with back-pressure; fails with the stream's error. */
class Sink {
  private failed: Error | undefined;
  constructor(private readonly out: Writable) {
    out.on('error', (err) => (this.failed ??= err));
  }
  async write(buf: Buffer): Promise<void> {
    if (this.failed) throw this.failed;
    if (!this.out.write(buf)) {
      await new Promise<void>((resolve, reject) => {
        const onDrain = (): void => { this.out.off('error', onError); resolve(); };
        const onError = (err: Error): void => { this.out.off('drain', onDrain); reject(err); };
        this.out.once('drain', onDrain);
        this.out.once('error', onError);
      });
    }
  }
  async end(): Promise<void> {
    if (this.failed) throw this.failed;
    await new Promise<void>((resolve, reject) => {
      this.out.once('error', reject);
      this.out.end(() => resolve());
    });
  }
}

/**
 * Flattens `layers` (bottom first) into one tar written to `out` (ended when
 * done). Throws IMAGE_INVALID for a layer that is not a readable tar (bad gzip,
 * a truncated blob, an entry climbing out with `..`, a hard link to nothing).
 */
export async function flattenLayers(layers: LayerInput[], out: Writable, options: FlattenOptions = {}): Promise<FlattenStats> {
  const tree = new Tree();
  const stats: FlattenStats = {
    layers: layers.length, layersReread: 0, entries: 0, directories: 0, files: 0, symlinks: 0, hardlinks: 0,
    linkCopies: 0, specials: 0, whiteouts: 0, dataBytes: 0, blocks4k: 0, xattrs: [],
  };

  // Pass 1: headers only.
  for (let index = 0; index < layers.length; index++) {
    const layer = layers[index]!;
    const added: Entry[] = [];
    const opaque: string[] = [];
    const deleted: string[] = [];
    let bytes = 0;
    await readLayer(
      layer,
      async ({ header }, ordinal) => {
        const path = normalisePath(header.name);
        if (path === null) throw invalid(layer, `entry ${JSON.stringify(header.name)} climbs out of the root (..)`);
        const slash = path.lastIndexOf('/');
        const base = path.slice(slash + 1);
        const dir = slash < 0 ? '' : path.slice(0, slash);
        if (base.startsWith('.wh.')) {
          stats.whiteouts++;
          if (base === '.wh..wh..opq') opaque.push(dir);
          else if (base.startsWith('.wh..wh.')) { /* aufs bookkeeping (.wh..wh.plnk, ...): ignored */ }
          else deleted.push(dir ? `${dir}/${base.slice(4)}` : base.slice(4));
          return;
        }
        if (path === '') return; // the root directory's own entry: ext4's root is root:root 0755
        const e = toEntry(layer, index, ordinal, header, path);
        if (e.kind === 'link') {
          const target = normalisePath(e.linkname);
          if (target === null || target === '') throw invalid(layer, `hard link ${path} -> ${JSON.stringify(e.linkname)} climbs out of the root`);
          e.linkname = target;
        }
        added.push(e);
      },
      options.onProgress ? (n) => options.onProgress!({ pass: 1, layer: index, layers: layers.length, bytes: (bytes += n) }) : undefined,
    );
    // This layer's whiteouts hide what the lower layers hold...
    for (const dir of opaque) {
      const node = tree.lookup(dir);
      if (node?.children) node.children.clear();
    }
    for (const path of deleted) {
      const slash = path.lastIndexOf('/');
      const parent = tree.lookup(slash < 0 ? '' : path.slice(0, slash));
      parent?.children?.delete(path.slice(slash + 1));
    }
    // ...then its entries are laid over them, in tar order (a later duplicate wins).
    for (const e of added) {
      const at = tree.parentFor(e.path, e.mtime);
      if (typeof at === 'string') throw invalid(layer, at);
      if (e.kind === 'link') {
        const target = tree.lookup(e.linkname);
        if (!target || target.entry.layer < 0) throw invalid(layer, `hard link ${e.path} -> ${e.linkname}: no such file in this or a lower layer`);
        if (target.children) throw invalid(layer, `hard link ${e.path} -> ${e.linkname}: the target is a directory`);
        e.source = target.entry.kind === 'link' ? target.entry.source! : target.entry;
      }
      const existing = at.node.children!.get(at.name);
      if (e.kind === 'directory') {
        // A directory over a directory: the new metadata, the lower children stay.
        at.node.children!.set(at.name, { entry: e, children: existing?.children ?? new Map() });
      } else {
        at.node.children!.set(at.name, { entry: e });
      }
    }
  }
  for (const { path, mode } of options.ensureDirs ?? []) {
    const p = normalisePath(path);
    if (!p) continue;
    const at = tree.parentFor(p, 0);
    if (typeof at === 'string' || at.node.children!.has(at.name)) continue;
    at.node.children!.set(at.name, { entry: implicitDir(p, 0, mode), children: new Map() });
  }

  // The output plan.
  const sink = new Sink(out);
  const front: Buffer[] = []; // directories, then symlinks, devices, fifos, empty files
  const specials: Buffer[] = [];
  const withData = new Map<number, Map<number, { entry: Entry; path: string }>>(); // layer -> ordinal -> output
  const links: Buffer[] = [];
  const copies = new Map<Entry, string>(); // old link target -> the path its copy was written at
  const blocks = (bytes: number): number => Math.ceil(bytes / 4096);
  const emitted = (e: Entry, path: string, kind: Kind, linkname: string): Buffer => {
    stats.entries++;
    if (kind !== 'link' && e.xattrs) for (const [name, value] of e.xattrs) stats.xattrs.push({ path, name, value });
    return encodeEntry(e, path, kind, linkname);
  };
  const place = (e: Entry, path: string): void => {
    if (e.kind === 'file' && e.size > 0) {
      let byOrdinal = withData.get(e.layer);
      if (!byOrdinal) withData.set(e.layer, (byOrdinal = new Map()));
      byOrdinal.set(e.ordinal, { entry: e, path });
      stats.files++;
      stats.dataBytes += e.size;
      stats.blocks4k += blocks(e.size);
      return;
    }
    if (e.kind === 'file') stats.files++;
    else if (e.kind === 'symlink') { stats.symlinks++; if (Buffer.byteLength(e.linkname) >= 60) stats.blocks4k++; }
    else stats.specials++;
    specials.push(emitted(e, path, e.kind, e.kind === 'symlink' ? e.linkname : ''));
  };
  const walk = (node: Node, path: string): void => {
    for (const [name, child] of node.children!) {
      const p = path ? `${path}/${name}` : name;
      const e = child.entry;
      if (child.children) {
        stats.directories++;
        stats.blocks4k += 1 + blocks(child.children.size * 40); // the directory's own blocks
        front.push(emitted(e, p, 'directory', ''));
        walk(child, p);
      } else if (e.kind === 'link') {
        const source = e.source!;
        const live = tree.lookup(source.path)?.entry === source;
        const copy = copies.get(source);
        if (live || copy !== undefined) {
          stats.hardlinks++;
          links.push(emitted({ ...e, xattrs: undefined }, p, 'link', live ? source.path : copy!));
        } else {
          // The file this link named was replaced or deleted above it: the link becomes that file.
          copies.set(source, p);
          stats.linkCopies++;
          place(source, p);
        }
      } else {
        place(e, p);
      }
    }
  };
  walk(tree.root, '');
  for (const b of front) await sink.write(b);
  for (const b of specials) await sink.write(b);

  // Pass 2: the data, layer by layer, only where there is some to copy.
  const pad = Buffer.alloc(512);
  for (let index = 0; index < layers.length; index++) {
    const wanted = withData.get(index);
    if (!wanted) continue;
    stats.layersReread++;
    const layer = layers[index]!;
    let bytes = 0;
    let left = wanted.size;
    await readLayer(
      layer,
      async ({ header, body }, ordinal) => {
        const hit = wanted.get(ordinal);
        if (!hit) return;
        if (normalisePath(header.name) !== hit.entry.path || header.size !== hit.entry.size) {
          throw invalid(layer, `changed between two reads (entry ${ordinal}: ${header.name})`);
        }
        await sink.write(emitted(hit.entry, hit.path, 'file', ''));
        let copied = 0;
        for await (const chunk of body) {
          copied += (chunk as Buffer).length;
          await sink.write(chunk as Buffer);
        }
        if (copied !== hit.entry.size) throw invalid(layer, `${header.name}: ${copied} of ${hit.entry.size} bytes`);
        const rest = copied % 512;
        if (rest) await sink.write(pad.subarray(0, 512 - rest));
        left--;
      },
      options.onProgress ? (n) => options.onProgress!({ pass: 2, layer: index, layers: layers.length, bytes: (bytes += n) }) : undefined,
    );
    if (left !== 0) throw invalid(layer, `changed between two reads (${left} files not found again)`);
  }
  for (const b of links) await sink.write(b);
  await sink.write(Buffer.alloc(1024));
  await sink.end();
  return stats;
}
