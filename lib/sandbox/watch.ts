// files.watchDir: a directory watched by the agent (inotify in the guest). Events arrive on one
// request stream, numbered; after a reconnect (a resumed sandbox, a reset transport) the handle
// reattaches to the same watch from the next number it has not seen, so nothing is missed or
// repeated. Events the agent could not keep (a reader too slow, the kernel's queue full) arrive
// as one `overflow` event with the count, never silently dropped.
import { TorporError } from '../errors.js';
import { abortable, withinMs } from './deadline.js';
import type { AgentClient } from '../agent/client.js';
import { FieldWriter } from '../agent/fields.js';
import { FLAG_END, FrameType } from '../agent/protocol.js';
import type { RequestStream } from '../agent/stream.js';

/** E2B's event types, plus `overflow`: events were lost (`dropped` says how many, 0 = unknown). */
export type FilesystemEventType = 'create' | 'write' | 'remove' | 'rename' | 'chmod' | 'overflow';
/** The event types by name, as E2B's enum spells them (`FilesystemEventType.WRITE === 'write'`). */
export const FilesystemEventType = {
  /** A file or directory was created. */
  CREATE: 'create',
  /** A file was written. */
  WRITE: 'write',
  /** A file or directory was removed. */
  REMOVE: 'remove',
  /** A file or directory was moved away: reported for its old name (the new name gets `create`). */
  RENAME: 'rename',
  /** Permissions or ownership changed. */
  CHMOD: 'chmod',
  /** Events were lost. */
  OVERFLOW: 'overflow',
} as const;

/** One change in a watched directory, as {@link Files.watchDir} reports it. */
export interface FilesystemEvent {
  /** Path relative to the watched directory ('' for an overflow). */
  name: string;
  /** What happened. */
  type: FilesystemEventType;
  /** overflow only: how many events were lost (0: the kernel did not say). */
  dropped?: number;
}

/** How {@link Files.watchDir} watches. Every field is optional. */
export interface WatchOpts {
  /** Watch the whole tree below the directory (directories created later too). */
  recursive?: boolean;
  /** Stop watching after this long (default 60 s, as E2B; 0 = until stop()). */
  timeoutMs?: number;
  /** Called once when the watch ends: stop(), timeoutMs, the directory removed (no error), or a
   *  failure (the error). */
  onExit?: (err?: Error) => void | Promise<void>;
}

export const DEFAULT_WATCH_TIMEOUT_MS = 60_000;

/** A directory watch, as {@link Files.watchDir} returns it: it lasts until `stop()`, its timeout, or the directory's removal. */
export class WatchHandle implements AsyncDisposable {
  private stream!: RequestStream;
  private watchId: number | undefined;
  private nextSeq = 1;
  private ended = false;
  private timer: NodeJS.Timeout | undefined;
  /** Resolves once the agent watches (OK); rejects when it refused. */
  readonly started: Promise<void>;

  /** @internal built by Files.watchDir */
  constructor(
    client: AgentClient,
    request: FieldWriter,
    private readonly path: string,
    private readonly onEvent: (e: FilesystemEvent) => void | Promise<void>,
    private readonly opts: WatchOpts,
  ) {
    let started!: () => void;
    let refused!: (e: Error) => void;
    this.started = new Promise<void>((res, rej) => {
      started = res;
      refused = rej;
    });
    this.started.catch(() => undefined);
    this.stream = client.open(FrameType.WATCH, request, {
      onFrame: (type, flags, fields) => {
        if (type === FrameType.OK && this.watchId === undefined) {
          this.watchId = fields.u32('watch_id');
          started();
        } else if (type === FrameType.EVENT) {
          const seq = fields.u64n('seq') ?? this.nextSeq;
          if (seq < this.nextSeq) return; // replayed after a reattach: already delivered
          this.nextSeq = seq + 1;
          const event: FilesystemEvent = { name: fields.str('path') ?? '', type: (fields.str('event') ?? 'overflow') as FilesystemEventType };
          if (event.type === 'overflow') event.dropped = fields.u64n('dropped') ?? 0;
          this.deliver(event);
        }
        if (flags & FLAG_END) this.finish(); // the directory went away
      },
      onError: (err) => {
        refused(err);
        this.finish(err);
      },
      // After a reconnect: the same watch from the next event not yet seen.
      reissue: () =>
        this.watchId === undefined
          ? { type: FrameType.WATCH, fields: request, sameRequestId: true }
          : {
              type: FrameType.WATCH,
              fields: new FieldWriter().u32('watch_id', this.watchId).u64('seq', this.nextSeq),
              sameRequestId: false,
            },
    });
    const timeoutMs = opts.timeoutMs ?? DEFAULT_WATCH_TIMEOUT_MS;
    if (timeoutMs > 0) {
      this.timer = setTimeout(() => {
        this.stream.cancel();
        this.finish();
      }, timeoutMs);
      this.timer.unref?.();
    }
  }

  /** What `await using` does at the end of its scope: stop(). */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }

  /** Stops watching (the agent drops the watch). */
  async stop(): Promise<void> {
    if (this.ended) return;
    this.stream.cancel();
    this.finish();
  }

  private deliver(event: FilesystemEvent): void {
    try {
      const r = this.onEvent(event);
      if (r && typeof (r as Promise<void>).catch === 'function') (r as Promise<void>).catch((err) => this.failed(err));
    } catch (err) {
      this.failed(err);
    }
  }

  /** A throwing onEvent ends the watch, and onExit sees the error (as a throwing onStdout does). */
  private failed(err: unknown): void {
    if (this.ended) return;
    this.stream.cancel();
    this.finish(err instanceof Error ? err : new TorporError('REQUEST_FAILED', `onEvent of watchDir ${this.path} threw ${String(err)}`));
  }

  /** Called once when the watch ends, whichever way (watchStarted's signal listener goes). @internal */
  onEnd: (() => void) | undefined;

  private finish(err?: Error): void {
    if (this.ended) return;
    this.ended = true;
    if (this.timer) clearTimeout(this.timer);
    this.onEnd?.();
    const exit = this.opts.onExit;
    if (!exit) return;
    try {
      const r = exit(err);
      if (r && typeof (r as Promise<void>).catch === 'function') (r as Promise<void>).catch(() => undefined);
    } catch {
      // onExit is the last word: nothing is left to report its failure to.
    }
  }
}

/** requestTimeoutMs for the watch's start. */
export async function watchStarted(handle: WatchHandle, ms: number | undefined, path: string, signal?: AbortSignal): Promise<WatchHandle> {
  const stop = () => void handle.stop();
  await abortable(withinMs(handle.started, ms, `watchDir ${path}`, stop), signal, `watchDir ${path}`, stop);
  // After the start, the signal ends the watch, as it does fs.watch's.
  if (signal && !signal.aborted) {
    signal.addEventListener('abort', stop, { once: true });
    handle.onEnd = () => signal.removeEventListener('abort', stop);
  }
  return handle;
}
