// sbx.files: the guest's filesystem (E2B's words: read, write, list, getInfo, exists, makeDir,
// remove, rename). Reads and writes are streamed in frames under credit flow control, so a
// 50 MiB file never sits in one buffer on either side unless the caller asks for it whole.
import { posix } from 'node:path';
import { Readable } from 'node:stream';

import { TorporError } from '../errors.js';
import type { AgentClient } from '../agent/client.js';
import { FieldWriter, type Fields } from '../agent/fields.js';
import { FLAG_END, FrameType } from '../agent/protocol.js';
import type { RequestStream } from '../agent/stream.js';
import { checkInt, checkKnownKeys, checkObject, checkPath, fail } from './validate.js';

export type FileType = 'file' | 'dir' | 'symlink' | 'other';

export interface EntryInfo {
  name: string;
  type: FileType;
  path: string;
  size: number;
  /** Permission bits and file type bits, as st_mode. */
  mode: number;
  modifiedTime: Date;
  symlinkTarget?: string;
  /** Owner uid. */
  owner?: number;
}

export interface WriteInfo {
  name: string;
  type: FileType;
  path: string;
}

export type WriteData = string | ArrayBuffer | Uint8Array | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;
export interface WriteEntry {
  path: string;
  data: WriteData;
}

export class Files {
  private readonly client: () => AgentClient;

  /** @internal */
  constructor(client: () => AgentClient) {
    this.client = () => {
      const c = client();
      c.requireFeature('files');
      return c;
    };
  }

  read(path: string, opts?: { format?: 'text' }): Promise<string>;
  read(path: string, opts: { format: 'bytes' }): Promise<Uint8Array>;
  read(path: string, opts: { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    opts: { format?: 'text' | 'bytes' | 'stream' } = {},
  ): Promise<string | Uint8Array | ReadableStream<Uint8Array>> {
    checkPath('path', path);
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, ['format']);
    const format = opts.format ?? 'text';
    if (format !== 'text' && format !== 'bytes' && format !== 'stream') fail('opts.format', "'text', 'bytes' or 'stream'", format);
    const reader = new FileReader(this.client(), path);
    await reader.opened;
    if (format === 'stream') return reader.toWebStream();
    const buf = await reader.readAll();
    return format === 'text' ? buf.toString('utf8') : new Uint8Array(buf.buffer, buf.byteOffset, buf.length);
  }

  /** Writes a file atomically (temp file, fsync, rename), creating parent directories as needed.
   *  Also accepts an array of { path, data } and writes each. */
  write(path: string, data: WriteData, opts?: { mode?: number }): Promise<WriteInfo>;
  write(files: WriteEntry[], opts?: { mode?: number }): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOpts?: WriteData | { mode?: number },
    maybeOpts?: { mode?: number },
  ): Promise<WriteInfo | WriteInfo[]> {
    if (Array.isArray(pathOrFiles)) {
      const opts = (dataOrOpts ?? {}) as { mode?: number };
      pathOrFiles.forEach((f, i) => {
        checkObject(`files[${i}]`, f);
        checkPath(`files[${i}].path`, f.path);
        checkData(`files[${i}].data`, f.data);
      });
      checkWriteOpts(opts);
      const out: WriteInfo[] = [];
      for (const f of pathOrFiles) out.push(await this.writeOne(f.path, f.data, opts));
      return out;
    }
    checkPath('path', pathOrFiles);
    checkData('data', dataOrOpts);
    const opts = maybeOpts ?? {};
    checkWriteOpts(opts);
    return this.writeOne(pathOrFiles, dataOrOpts as WriteData, opts);
  }

  async list(path: string, opts: { depth?: number } = {}): Promise<EntryInfo[]> {
    checkPath('path', path);
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, ['depth']);
    checkInt('opts.depth', opts.depth, 1, 16);
    const fw = new FieldWriter().str('path', path).u32('depth', opts.depth ?? 1);
    const answer = await this.client().call(FrameType.FILE_LIST, fw);
    return answer.nested('entry').map((e) => toEntry(e, path));
  }

  async getInfo(path: string): Promise<EntryInfo> {
    checkPath('path', path);
    const answer = await this.client().call(FrameType.FILE_STAT, new FieldWriter().str('path', path));
    const entry = answer.nested('entry')[0];
    if (!entry) throw new TorporError('PROTOCOL_ERROR', `FILE_STAT answer for ${path} has no entry`);
    return toEntry(entry, posix.dirname(path), path);
  }

  async exists(path: string): Promise<boolean> {
    try {
      await this.getInfo(path);
      return true;
    } catch (err) {
      if (err instanceof TorporError && err.code === 'FILE_NOT_FOUND') return false;
      throw err;
    }
  }

  /** Creates a directory and its parents. Resolves false when it already existed. */
  async makeDir(path: string, opts: { mode?: number } = {}): Promise<boolean> {
    checkPath('path', path);
    checkWriteOpts(opts);
    if (await this.exists(path)) return false;
    const fw = new FieldWriter().str('path', path).u32('mode', opts.mode ?? 0o755).bool('recursive', true);
    await this.client().call(FrameType.MKDIR, fw);
    return true;
  }

  /** Removes a file or a directory tree. */
  async remove(path: string): Promise<void> {
    checkPath('path', path);
    await this.client().call(FrameType.REMOVE, new FieldWriter().str('path', path).bool('recursive', true));
  }

  async rename(oldPath: string, newPath: string): Promise<EntryInfo> {
    checkPath('oldPath', oldPath);
    checkPath('newPath', newPath);
    await this.client().call(FrameType.RENAME, new FieldWriter().str('path', oldPath).str('path2', newPath));
    return this.getInfo(newPath);
  }

  private async writeOne(path: string, data: WriteData, opts: { mode?: number }): Promise<WriteInfo> {
    const fw = new FieldWriter().str('path', path).u32('mode', opts.mode ?? 0o644);
    let done!: (f: Fields) => void;
    let failed!: (e: TorporError) => void;
    const answer = new Promise<Fields>((res, rej) => {
      done = res;
      failed = rej;
    });
    answer.catch(() => undefined);
    let agentError: TorporError | undefined;
    const stream = this.client().open(FrameType.FILE_WRITE, fw, {
      onFrame: (type, _flags, fields) => {
        if (type === FrameType.OK) done(fields);
      },
      onError: (err) => {
        agentError = err;
        failed(err);
      },
    });
    try {
      await sendAll(stream, data);
    } catch (err) {
      if (!stream.done) stream.cancel();
      throw agentError ?? err;
    }
    await answer;
    return { name: posix.basename(path), type: 'file', path };
  }
}

async function sendAll(stream: RequestStream, data: WriteData): Promise<void> {
  if (typeof data === 'string') return stream.sendData(FrameType.DATA, Buffer.from(data, 'utf8'), true);
  if (data instanceof Uint8Array) return stream.sendData(FrameType.DATA, data, true);
  if (data instanceof ArrayBuffer) return stream.sendData(FrameType.DATA, new Uint8Array(data), true);
  const source: AsyncIterable<Uint8Array> =
    typeof Blob !== 'undefined' && data instanceof Blob
      ? (data.stream() as unknown as AsyncIterable<Uint8Array>)
      : (data as AsyncIterable<Uint8Array>);
  for await (const chunk of source) {
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk as string) : chunk;
    if (!(bytes instanceof Uint8Array)) throw new TorporError('INVALID_ARGUMENT', 'a write stream must yield Uint8Array chunks');
    if (bytes.length > 0) await stream.sendData(FrameType.DATA, bytes, false);
  }
  await stream.sendData(FrameType.DATA, new Uint8Array(0), true);
}

/** FILE_READ: OK {size}, then DATA frames; credit goes back as the consumer takes chunks, so an
 *  unread stream holds at most one window (256 KiB) in memory. */
class FileReader {
  readonly opened: Promise<number>;
  private readonly chunks: Buffer[] = [];
  private ended = false;
  private error: TorporError | undefined;
  private wake: (() => void) | null = null;
  private readonly stream: RequestStream;

  constructor(client: AgentClient, readonly path: string) {
    let opened!: (size: number) => void;
    let openFailed!: (e: TorporError) => void;
    this.opened = new Promise((res, rej) => {
      opened = res;
      openFailed = rej;
    });
    this.opened.catch(() => undefined);
    this.stream = client.open(FrameType.FILE_READ, new FieldWriter().str('path', path), {
      onFrame: (type, flags, fields) => {
        if (type === FrameType.OK) opened(fields.u64n('size') ?? 0);
        else if (type === FrameType.DATA) {
          const data = fields.bytes('data');
          if (data && data.length > 0) this.chunks.push(data);
        }
        if (flags & FLAG_END) this.ended = true;
        this.notify();
      },
      onError: (err) => {
        this.error = err;
        openFailed(err);
        this.notify();
      },
    });
  }

  private notify(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  /** Next chunk, or null at the end. */
  async next(): Promise<Buffer | null> {
    for (;;) {
      const chunk = this.chunks.shift();
      if (chunk) {
        this.stream.consumed(chunk.length);
        return chunk;
      }
      if (this.error) throw this.error;
      if (this.ended) return null;
      await new Promise<void>((r) => (this.wake = r));
    }
  }

  async readAll(): Promise<Buffer> {
    const size = await this.opened;
    const parts: Buffer[] = [];
    let total = 0;
    for (let c = await this.next(); c; c = await this.next()) {
      parts.push(c);
      total += c.length;
    }
    // `size` is what stat said at open: /proc files say 0 and have content, /sys files say 4096
    // and have less, so only more than announced (from a non-zero size) is wrong.
    if (size > 0 && total > size) {
      throw new TorporError('PROTOCOL_ERROR', `${this.path}: the agent sent ${total} bytes of a file it announced as ${size}`);
    }
    return Buffer.concat(parts, total);
  }

  toWebStream(): ReadableStream<Uint8Array> {
    return new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        const chunk = await this.next();
        if (chunk) controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.length));
        else controller.close();
      },
      cancel: () => {
        this.stream.cancel();
      },
    }, { highWaterMark: 0 });
  }
}

function toEntry(e: Fields, parent: string, exactPath?: string): EntryInfo {
  const path = exactPath ?? e.str('path') ?? parent;
  const type = (e.str('type') ?? 'other') as FileType;
  const mtimeNs = e.i64('mtime_ns') ?? 0n;
  const entry: EntryInfo = {
    name: posix.basename(path),
    type: type === 'file' || type === 'dir' || type === 'symlink' ? type : 'other',
    path,
    size: e.u64n('size') ?? 0,
    mode: e.u32('mode') ?? 0,
    modifiedTime: new Date(Number(mtimeNs / 1_000_000n)),
  };
  const target = e.str('target');
  if (target !== undefined) entry.symlinkTarget = target;
  const owner = e.u32('uid_out');
  if (owner !== undefined) entry.owner = owner;
  return entry;
}

function checkWriteOpts(opts: unknown): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts as object, ['mode']);
  checkInt('opts.mode', (opts as { mode?: number }).mode, 0, 0o7777);
}

function checkData(what: string, data: unknown): void {
  if (
    typeof data === 'string' ||
    data instanceof Uint8Array ||
    data instanceof ArrayBuffer ||
    (typeof Blob !== 'undefined' && data instanceof Blob) ||
    data instanceof Readable ||
    (typeof data === 'object' && data !== null && Symbol.asyncIterator in data)
  ) {
    return;
  }
  fail(what, 'a string, bytes, a Blob or a stream', data);
}
