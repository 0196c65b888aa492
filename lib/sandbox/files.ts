// sbx.files: the guest's filesystem (E2B's words: read, write, list, getInfo, exists, makeDir,
// remove, rename, watchDir). Every call acts as a guest user (`user`, default the agent's default
// user) and takes requestTimeoutMs. Reads and writes are streamed in frames under credit flow control, so a
// 50 MiB file never sits in one buffer on either side unless the caller asks for it whole.
import { posix } from 'node:path';
import { Readable } from 'node:stream';

import { AbortError, TorporError, createError } from '../errors.js';
import { abortable, throwIfAborted, withinMs } from './deadline.js';
import type { AgentClient } from '../agent/client.js';
import { FieldWriter, type Fields } from '../agent/fields.js';
import { FLAG_END, FrameType } from '../agent/protocol.js';
import type { RequestStream } from '../agent/stream.js';
import { WatchHandle, watchStarted, type FilesystemEvent, type WatchOpts } from './watch.js';
import { REQUEST_KEYS, callOpts, checkInt, checkKnownKeys, checkObject, checkPath, checkRequestOptions, checkString, fail, type RequestOpts } from './validate.js';

/** What a guest path is: a regular file, a directory, a symlink, or anything else (device, socket, fifo). */
export type FileType = 'file' | 'dir' | 'symlink' | 'other';

/** A file or directory in the guest, as {@link Files.list}, {@link Files.getInfo} and {@link Files.rename} report it. */
export interface EntryInfo {
  /** Its name (the last part of its path). */
  name: string;
  /** What it is (a symlink is reported as the link). */
  type: FileType;
  /** Its absolute path in the guest. */
  path: string;
  /** Its size in bytes. */
  size: number;
  /** File type and permission bits, as st_mode (0o100644 for a plain file). */
  mode: number;
  /** The permission bits as `ls -l` shows them: 'rwxr-xr-x'. */
  permissions: string;
  /** Owner's user name (the uid as a string when the guest has no name for it). */
  owner: string;
  /** Group name (the gid as a string when the guest has none). */
  group: string;
  /** Owner's uid and group's gid. */
  uid: number;
  /** The group's gid. */
  gid: number;
  /** Its last modification time. */
  modifiedTime: Date;
  /** Where a symlink points (symlinks only). */
  symlinkTarget?: string;
}

/** Options every files call takes (E2B's). */
export interface FileOpts extends RequestOpts {
  /** Act as this guest user: a relative path is relative to that user's home, and what the
   *  call creates is owned by that user. Default: the agent's default user (`user` in
   *  torpor's image). */
  user?: string;
}
const FILE_KEYS = ['user', ...REQUEST_KEYS] as const;

/** A file {@link Files.write} wrote. */
export interface WriteInfo {
  /** Its name. */
  name: string;
  /** 'file'. */
  type: FileType;
  /** Its absolute path in the guest. */
  path: string;
}

/** What {@link Files.write} takes as a file's contents: text (written as UTF-8), bytes, a Blob, or a stream of bytes (sent as it comes). */
export type WriteData = string | ArrayBuffer | Uint8Array | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;
/** One file of a {@link Files.write} of several. */
export interface WriteEntry {
  /** The guest path (a relative one is relative to the user's home). */
  path: string;
  /** Its contents. */
  data: WriteData;
}

/**
 * The guest's filesystem (`sbx.files`): read, write, list, stat, make directories, remove,
 * rename, watch. Every call acts as a guest user (`opts.user`, default the agent's default user)
 * and takes `requestTimeoutMs`. Errors from the guest carry its code: FILE_NOT_FOUND
 * ({@link FileNotFoundError}), PERMISSION_DENIED, NOT_A_DIRECTORY, IS_A_DIRECTORY, NOT_EMPTY,
 * OUT_OF_SPACE; TIMEOUT past `requestTimeoutMs`.
 */
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

  /**
   * Reads a file as text (UTF-8).
   *
   * @param path - The guest path (a relative one is relative to the user's home).
   * @param opts - `format: 'text'` (the default), `user`, `requestTimeoutMs`.
   * @throws {@link FileNotFoundError} (FILE_NOT_FOUND) when there is no such file.
   * @throws {@link TorporError} IS_A_DIRECTORY, PERMISSION_DENIED as the guest says.
   */
  read(path: string, opts?: FileOpts & { format?: 'text' }): Promise<string>;
  /**
   * Reads a file as bytes.
   *
   * @param path - The guest path.
   * @param opts - `format: 'bytes'`, `user`, `requestTimeoutMs`.
   * @throws {@link FileNotFoundError} (FILE_NOT_FOUND) when there is no such file.
   */
  read(path: string, opts: FileOpts & { format: 'bytes' }): Promise<Uint8Array>;
  /**
   * Reads a file as a Blob.
   *
   * @param path - The guest path.
   * @param opts - `format: 'blob'`, `user`, `requestTimeoutMs`.
   * @throws {@link FileNotFoundError} (FILE_NOT_FOUND) when there is no such file.
   */
  read(path: string, opts: FileOpts & { format: 'blob' }): Promise<Blob>;
  /**
   * Opens a file as a stream of bytes (it never sits whole in memory; `requestTimeoutMs` bounds the opening).
   *
   * @param path - The guest path.
   * @param opts - `format: 'stream'`, `user`, `requestTimeoutMs`.
   * @throws {@link FileNotFoundError} (FILE_NOT_FOUND) when there is no such file.
   */
  read(path: string, opts: FileOpts & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    opts: FileOpts & { format?: 'text' | 'bytes' | 'blob' | 'stream' } = {},
  ): Promise<string | Uint8Array | Blob | ReadableStream<Uint8Array>> {
    checkPath('path', path);
    checkFileOpts(opts, ['format']);
    const format = opts.format ?? 'text';
    if (format !== 'text' && format !== 'bytes' && format !== 'blob' && format !== 'stream') {
      fail('opts.format', "'text', 'bytes', 'blob' or 'stream'", format);
    }
    const reader = new FileReader(this.client(), path, this.target(new FieldWriter().str('path', path), opts));
    // requestTimeoutMs bounds the whole read, or the opening of a stream.
    return withTimeout(opts, `read ${path}`, () => reader.stream.cancel(), async () => {
      await reader.opened;
      if (format === 'stream') return reader.toWebStream();
      const buf = await reader.readAll();
      if (format === 'text') return buf.toString('utf8');
      const bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.length);
      return format === 'blob' ? new Blob([bytes]) : bytes;
    });
  }

  /**
   * Writes a file atomically (temp file, fsync, rename), creating parent directories as needed.
   *
   * @param path - The guest path (a relative one is relative to the user's home).
   * @param data - Its contents: text, bytes, a Blob or a stream.
   * @param opts - `mode`, `user`, `requestTimeoutMs`.
   * @returns What was written.
   * @throws {@link TorporError} PERMISSION_DENIED, IS_A_DIRECTORY, NOT_A_DIRECTORY or OUT_OF_SPACE as the guest says.
   */
  write(path: string, data: WriteData, opts?: WriteOpts): Promise<WriteInfo>;
  /**
   * Writes several files, one after the other, each atomically.
   *
   * @param files - The paths and their contents.
   * @param opts - `mode`, `user`, `requestTimeoutMs`, for every file.
   * @returns What was written, in the same order.
   */
  write(files: WriteEntry[], opts?: WriteOpts): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOpts?: WriteData | WriteOpts,
    maybeOpts?: WriteOpts,
  ): Promise<WriteInfo | WriteInfo[]> {
    if (Array.isArray(pathOrFiles)) {
      const opts = (dataOrOpts ?? {}) as WriteOpts;
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

  /**
   * Lists a directory.
   *
   * @param path - The guest directory.
   * @param opts - `depth`: how many levels down (1, the default, to 16); `user`, `requestTimeoutMs`.
   * @returns Its entries (and theirs, with depth over 1).
   * @throws {@link FileNotFoundError} (FILE_NOT_FOUND) when there is no such directory.
   * @throws {@link TorporError} NOT_A_DIRECTORY when it is not a directory.
   */
  async list(path: string, opts: FileOpts & { depth?: number } = {}): Promise<EntryInfo[]> {
    checkPath('path', path);
    checkFileOpts(opts, ['depth']);
    checkInt('opts.depth', opts.depth, 1, 16);
    const fw = this.target(new FieldWriter().str('path', path).u32('depth', opts.depth ?? 1), opts);
    const answer = await this.client().call(FrameType.FILE_LIST, fw, callOpts(opts));
    return answer.nested('entry').map((e) => toEntry(e, path));
  }

  /**
   * The entry at path itself (a symlink is reported as the link, with its target).
   *
   * @param path - The guest path.
   * @param opts - `user`, `requestTimeoutMs`.
   * @throws {@link FileNotFoundError} (FILE_NOT_FOUND) when there is nothing there.
   */
  async getInfo(path: string, opts: FileOpts = {}): Promise<EntryInfo> {
    checkPath('path', path);
    checkFileOpts(opts);
    return this.stat(path, opts, false);
  }

  /**
   * Whether something exists at path, following symlinks (a dangling link: false), as E2B.
   *
   * @param path - The guest path.
   * @param opts - `user`, `requestTimeoutMs`.
   */
  async exists(path: string, opts: FileOpts = {}): Promise<boolean> {
    checkPath('path', path);
    checkFileOpts(opts);
    try {
      await this.stat(path, opts, true);
      return true;
    } catch (err) {
      if (err instanceof TorporError && err.code === 'FILE_NOT_FOUND') return false;
      throw err;
    }
  }

  /** Creates a directory and its parents. Resolves false when it already existed; throws
   *  NOT_A_DIRECTORY when the path (or one on its way) exists and is not a directory.
   *
   * @param path - The guest directory.
   * @param opts - `mode` (default 0o755), `user`, `requestTimeoutMs`.
   * @returns true when it was made, false when it already existed.
   */
  async makeDir(path: string, opts: FileOpts & { mode?: number } = {}): Promise<boolean> {
    checkPath('path', path);
    checkFileOpts(opts, ['mode']);
    checkInt('opts.mode', opts.mode, 0, 0o7777);
    try {
      const info = await this.stat(path, opts, true);
      if (info.type === 'dir') return false;
      throw createError('NOT_A_DIRECTORY', `makeDir ${path}: it exists and is not a directory (${info.type})`);
    } catch (err) {
      if (!(err instanceof TorporError && err.code === 'FILE_NOT_FOUND')) throw err;
    }
    const fw = this.target(new FieldWriter().str('path', path).u32('mode', opts.mode ?? 0o755).bool('recursive', true), opts);
    await this.client().call(FrameType.MKDIR, fw, callOpts(opts));
    return true;
  }

  /**
   * Removes a file or a directory tree. A path that does not exist is fine (as E2B).
   *
   * @param path - The guest path.
   * @param opts - `user`, `requestTimeoutMs`.
   * @throws {@link TorporError} PERMISSION_DENIED as the guest says.
   */
  async remove(path: string, opts: FileOpts = {}): Promise<void> {
    checkPath('path', path);
    checkFileOpts(opts);
    const fw = this.target(new FieldWriter().str('path', path).bool('recursive', true), opts);
    try {
      await this.client().call(FrameType.REMOVE, fw, callOpts(opts));
    } catch (err) {
      if (!(err instanceof TorporError && err.code === 'FILE_NOT_FOUND')) throw err;
    }
  }

  /**
   * Moves oldPath to newPath, creating newPath's missing parent directories (as E2B).
   *
   * @param oldPath - What to move.
   * @param newPath - Where to.
   * @param opts - `user`, `requestTimeoutMs`.
   * @returns The entry at its new path.
   * @throws {@link FileNotFoundError} (FILE_NOT_FOUND) when oldPath does not exist.
   */
  async rename(oldPath: string, newPath: string, opts: FileOpts = {}): Promise<EntryInfo> {
    checkPath('oldPath', oldPath);
    checkPath('newPath', newPath);
    checkFileOpts(opts);
    const fw = this.target(new FieldWriter().str('path', oldPath).str('path2', newPath), opts);
    await this.client().call(FrameType.RENAME, fw, callOpts(opts));
    return this.stat(newPath, opts, false);
  }

  /** Watches a directory: onEvent gets create, write, remove, rename and chmod events (names
   *  relative to path), and `overflow` when events were lost. The watch survives a reconnect.
   *  Stops after opts.timeoutMs (default 60 s, as E2B; 0 = never) or handle.stop().
   *
   * @param path - The guest directory.
   * @param onEvent - Called with each event, in order.
   * @param opts - `recursive`, `timeoutMs`, `onExit`, `user`, `requestTimeoutMs`.
   * @returns A handle, once the watch is in place (events from then on are reported).
   * @throws {@link FileNotFoundError} (FILE_NOT_FOUND) when there is no such directory.
   */
  async watchDir(
    path: string,
    onEvent: (event: FilesystemEvent) => void | Promise<void>,
    opts: FileOpts & WatchOpts = {},
  ): Promise<WatchHandle> {
    checkPath('path', path);
    if (typeof onEvent !== 'function') fail('onEvent', 'a function', onEvent);
    checkFileOpts(opts, ['recursive', 'timeoutMs', 'onExit']);
    checkInt('opts.timeoutMs', opts.timeoutMs, 0, 2 ** 31 - 1);
    if (opts.recursive !== undefined && typeof opts.recursive !== 'boolean') fail('opts.recursive', 'a boolean', opts.recursive);
    if (opts.onExit !== undefined && typeof opts.onExit !== 'function') fail('opts.onExit', 'a function', opts.onExit);
    const client = this.client();
    client.requireFeature('watch');
    const fw = this.target(new FieldWriter().str('path', path).bool('recursive', opts.recursive ?? false), opts);
    const handle = new WatchHandle(client, fw, path, onEvent, opts);
    return watchStarted(handle, opts.requestTimeoutMs, path, opts.signal);
  }

  private async stat(path: string, opts: FileOpts, follow: boolean): Promise<EntryInfo> {
    const fw = this.target(new FieldWriter().str('path', path), opts);
    // An agent before the `users` feature stats the link itself (it skips the unknown field).
    if (follow && this.client().supports('users')) fw.bool('follow', true);
    const answer = await this.client().call(FrameType.FILE_STAT, fw, callOpts(opts));
    const entry = answer.nested('entry')[0];
    if (!entry) throw new TorporError('PROTOCOL_ERROR', `FILE_STAT answer for ${path} has no entry`);
    return toEntry(entry, posix.dirname(path), path);
  }

  /** Adds the `user` field (the agent resolves relative paths and ownership with it). */
  private target(fw: FieldWriter, opts: FileOpts): FieldWriter {
    if (opts.user === undefined) return fw;
    this.client().requireFeature('users');
    return fw.str('user', opts.user);
  }

  private async writeOne(path: string, data: WriteData, opts: WriteOpts): Promise<WriteInfo> {
    throwIfAborted(opts.signal, `write ${path}`);
    // No mode: a new file gets 0644, an existing one keeps its mode and owner (the agent's rule).
    const fw = this.target(new FieldWriter().str('path', path), opts);
    if (opts.mode !== undefined) fw.u32('mode', opts.mode);
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
    const cancel = () => {
      if (!stream.done) stream.cancel();
    };
    // An abort while bytes are still going cancels the write: the agent removes its temporary
    // file and the target is untouched. Once the last byte is sent the write is the agent's to
    // finish (fsync, rename): it completes, so the caller never sees ABORTED for a file written.
    await withinMs(
      (async () => {
        try {
          await abortable(sendAll(stream, data), opts.signal, `write ${path}`, cancel);
        } catch (err) {
          cancel();
          throw err instanceof AbortError ? err : (agentError ?? err);
        }
        await answer;
      })(),
      opts.requestTimeoutMs,
      `write ${path}`,
      cancel,
    );
    return { name: posix.basename(path), type: 'file', path };
  }
}

export interface WriteOpts extends FileOpts {
  /** Permission bits of the file (default: 0o644 for a new file; an existing file keeps its
   *  mode and owner, as an in-place write would). */
  mode?: number;
}

/** Runs `work`, failing with TIMEOUT when opts.requestTimeoutMs passes first, or ABORTED when
 *  opts.signal aborts first (after `abandon` either way). */
function withTimeout<T>(opts: FileOpts, what: string, abandon: () => void, work: () => Promise<T>): Promise<T> {
  throwIfAborted(opts.signal, what);
  return abortable(withinMs(work(), opts.requestTimeoutMs, what, abandon), opts.signal, what, abandon);
}

function checkFileOpts(opts: unknown, more: readonly string[] = []): void {
  checkObject('opts', opts);
  const o = (opts ?? {}) as FileOpts;
  checkKnownKeys('opts', o, [...FILE_KEYS, ...more]);
  checkString('opts.user', o.user, { nonEmpty: true });
  checkRequestOptions(o);
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
  private isOpen = false;
  private error: TorporError | undefined;
  private wake: (() => void) | null = null;

  readonly stream: RequestStream;

  constructor(client: AgentClient, readonly path: string, request: FieldWriter) {
    let opened!: (size: number) => void;
    let openFailed!: (e: TorporError) => void;
    this.opened = new Promise((res, rej) => {
      opened = res;
      openFailed = rej;
    });
    this.opened.catch(() => undefined);
    this.stream = client.open(FrameType.FILE_READ, request, {
      onFrame: (type, flags, fields) => {
        if (type === FrameType.OK) {
          this.isOpen = true;
          opened(fields.u64n('size') ?? 0);
        } else if (type === FrameType.DATA) {
          const data = fields.bytes('data');
          if (data && data.length > 0) this.chunks.push(data);
        }
        if (flags & FLAG_END) {
          this.ended = true;
          // A stream the agent ended without its OK would leave the read waiting forever (the
          // stream is finished: a closing connection no longer fails it). Found by the host
          // codec fuzzer (test/fuzz/host-codec-fuzz.ts).
          if (!this.isOpen) {
            this.error = new TorporError('PROTOCOL_ERROR', `${path}: the agent ended the read without opening the file`);
            openFailed(this.error);
          }
        }
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
  const kind: FileType = type === 'file' || type === 'dir' || type === 'symlink' ? type : 'other';
  let mode = e.u32('mode') ?? 0;
  // An agent before the `users` feature sent the permission bits only: add the type's.
  if ((mode & 0o170000) === 0) mode |= TYPE_BITS[kind];
  const uid = e.u32('uid_out') ?? 0;
  const gid = e.u32('gid_out') ?? 0;
  const entry: EntryInfo = {
    name: posix.basename(path),
    type: kind,
    path,
    size: e.u64n('size') ?? 0,
    mode,
    permissions: permissionString(mode),
    owner: e.str('owner') ?? String(uid),
    group: e.str('group') ?? String(gid),
    uid,
    gid,
    modifiedTime: new Date(Number(mtimeNs / 1_000_000n)),
  };
  const target = e.str('target');
  if (target !== undefined) entry.symlinkTarget = target;
  return entry;
}

const TYPE_BITS: Record<FileType, number> = { file: 0o100000, dir: 0o040000, symlink: 0o120000, other: 0 };

/** 'rwxr-xr-x' of a mode, with setuid/setgid/sticky as ls shows them (s/S, t/T). */
export function permissionString(mode: number): string {
  const out: string[] = [];
  const special = [0o4000, 0o2000, 0o1000];
  for (let who = 0; who < 3; who++) {
    const bits = (mode >> (6 - who * 3)) & 7;
    out.push(bits & 4 ? 'r' : '-', bits & 2 ? 'w' : '-');
    const x = (bits & 1) !== 0;
    if (mode & special[who]!) out.push(who === 2 ? (x ? 't' : 'T') : x ? 's' : 'S');
    else out.push(x ? 'x' : '-');
  }
  return out.join('');
}

function checkWriteOpts(opts: unknown): void {
  checkFileOpts(opts, ['mode']);
  checkInt('opts.mode', (opts as { mode?: number } | undefined)?.mode, 0, 0o7777);
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
