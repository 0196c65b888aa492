// CommandHandle: a running (or finished) process seen through one ExecSession. Output is decoded
// as UTF-8 per stream (a character split across frames is kept whole), or kept as the bytes the
// process wrote (`encoding: 'buffer'`), and kept for wait().
import { StringDecoder } from 'node:string_decoder';
import { constants } from 'node:os';

import { CommandExitError, OutputLimitError, TimeoutError, TorporError } from '../errors.js';
import type { ExecSession, ExitInfo } from '../agent/exec.js';
import { checkKnownKeys, checkObject, checkSignal } from '../validate.js';
import { abortable } from './deadline.js';

/** What a command's output is delivered as: text (`'utf8'`, the default) or bytes (`'buffer'`). */
export type Output = string | Buffer;
/** How a command's output is delivered: `'utf8'` decodes it (a malformed byte becomes U+FFFD),
 *  `'buffer'` gives the bytes the process wrote, unchanged (images, archives, any binary). */
export type OutputEncoding = 'utf8' | 'buffer';
/** What an encoding delivers: Buffer for `'buffer'`, string for `'utf8'`. */
export type OutputOf<E extends OutputEncoding> = E extends 'buffer' ? Buffer : string;

/** How a command ended, and everything it printed (strings, or Buffers with `encoding: 'buffer'`). */
export interface CommandResult<O extends Output = string> {
  /** The exit status; 128 + the signal number when a signal ended it. */
  exitCode: number;
  /** Its whole stdout (decoded as UTF-8, or its bytes with `encoding: 'buffer'`). */
  stdout: O;
  /** Its whole stderr (as stdout). */
  stderr: O;
  /** Set when the process was killed by a signal (e.g. 'SIGKILL'). */
  signal?: string;
  /** Set when the process was killed because it ran past `timeoutMs`. */
  timedOut?: boolean;
  /** Why it failed, in E2B's words: 'exit status 3', 'signal: killed'. Unset on exit 0. */
  error?: string;
}

export interface OutputCallbacks<O extends Output = string> {
  /** Called with each piece of stdout as it comes (whole UTF-8 characters, or the bytes with
   *  `encoding: 'buffer'`). One that throws ends the receiving, and wait() rejects with its
   *  error; the process keeps running. */
  onStdout?: (data: O) => void | Promise<void>;
  /** Called with each piece of stderr as it comes, as onStdout. */
  onStderr?: (data: O) => void | Promise<void>;
}

/** What a CommandHandle needs from its Commands owner (signals and stdin go by pid). */
export interface ProcessControl {
  /** Signals the process group of `pid`; false when it is gone. */
  kill(pid: number, signal?: NodeJS.Signals | number): Promise<boolean>;
  /** Writes to the stdin of `pid`. */
  sendStdin(pid: number, data: string | Uint8Array): Promise<void>;
  /** Closes the stdin of `pid`. */
  closeStdin(pid: number): Promise<void>;
}

const signalNames = new Map<number, string>(Object.entries(constants.signals).map(([name, n]) => [n as number, name]));
export function signalName(n: number): string {
  return signalNames.get(n) ?? `signal ${n}`;
}

/** Collects one output stream: decoded incrementally (or kept as bytes), kept as chunks, joined
 *  on demand. At most `limit` bytes (of the decoded text, as UTF-8) are kept: the guest is
 *  untrusted and may print without end. The first push past it keeps what still fits, calls
 *  `onLimit` once and keeps nothing more; push() still returns every piece for the caller's
 *  callbacks. */
export class OutputBuffer<O extends Output = string> {
  /** Undefined for `'buffer'`: the bytes are kept as they came. */
  private readonly decoder: StringDecoder | undefined;
  private chunks: O[] = [];
  private joined: O | null;
  private keptBytes = 0;
  /** The stream outgrew the limit (what is kept is its head). */
  overflowed = false;

  constructor(
    private readonly keep: boolean,
    private readonly limit = Infinity,
    private readonly onLimit?: () => void,
    encoding: OutputEncoding = 'utf8',
  ) {
    this.decoder = encoding === 'utf8' ? new StringDecoder('utf8') : undefined;
    this.joined = (this.decoder ? '' : Buffer.alloc(0)) as O;
  }

  /** One frame's bytes in; the piece for the callbacks out (empty when a character is split).
   *  Bytes are copied: the frame's payload is a view of the connection's receive buffer, and the
   *  callbacks get a copy of their own (what they do to it does not change what is kept). */
  push(data: Buffer): O {
    if (this.decoder) {
      const text = this.decoder.write(data) as O;
      if (text.length) this.store(text);
      return text;
    }
    const kept = Buffer.from(data);
    if (kept.length) this.store(kept as O);
    return (this.keep ? Buffer.from(kept) : kept) as O;
  }
  finish(): O {
    const rest = (this.decoder ? this.decoder.end() : Buffer.alloc(0)) as O;
    if (rest.length) this.store(rest);
    return rest;
  }
  /** Everything kept so far (with `'buffer'`, the handle's own Buffer: copy it to change it). */
  get value(): O {
    if (this.joined === null) {
      const joined = (this.decoder ? (this.chunks as string[]).join('') : Buffer.concat(this.chunks as Buffer[])) as O;
      this.joined = joined;
      this.chunks = [joined];
    }
    return this.joined;
  }

  private store(piece: O): void {
    if (!this.keep || this.overflowed) return;
    if (this.limit !== Infinity) {
      const bytes = typeof piece === 'string' ? Buffer.byteLength(piece) : piece.length;
      if (this.keptBytes + bytes > this.limit) {
        const room = this.limit - this.keptBytes;
        // Text keeps the whole characters that fit (a throwaway decoder drops a split last one).
        const head = (
          typeof piece === 'string' ? new StringDecoder('utf8').write(Buffer.from(piece, 'utf8').subarray(0, room)) : piece.subarray(0, room)
        ) as O;
        this.append(head);
        this.keptBytes += typeof head === 'string' ? Buffer.byteLength(head) : head.length;
        this.overflowed = true;
        this.onLimit?.();
        return;
      }
      this.keptBytes += bytes;
    }
    this.append(piece);
  }
  private append(piece: O): void {
    if (!piece.length) return;
    this.chunks.push(piece);
    this.joined = null;
  }
}

/** Both output streams of one command, kept up to `maxBuffer` bytes each. The first stream to
 *  outgrow it is recorded and reported once through `onLimit` (the owner kills the process). */
export class CommandOutput<O extends Output = string> {
  readonly out: OutputBuffer<O>;
  readonly err: OutputBuffer<O>;
  /** The stream that outgrew maxBuffer first. */
  overflowed: 'stdout' | 'stderr' | undefined;
  /** Why killing the process after the overflow failed, if it did. */
  killError: unknown;
  /** The first error an onStdout/onStderr callback threw (wait() rejects with it). */
  callbackError: { error: unknown } | undefined;

  constructor(
    keep: boolean,
    readonly maxBuffer: number,
    onLimit: (stream: 'stdout' | 'stderr') => void = () => undefined,
    encoding: OutputEncoding = 'utf8',
  ) {
    const hit = (stream: 'stdout' | 'stderr') => {
      if (this.overflowed) return;
      this.overflowed = stream;
      onLimit(stream);
    };
    this.out = new OutputBuffer<O>(keep, maxBuffer, () => hit('stdout'), encoding);
    this.err = new OutputBuffer<O>(keep, maxBuffer, () => hit('stderr'), encoding);
  }

  /** A user callback threw: keep the first error and stop receiving (`detach`). */
  callbackFailed(error: unknown, detach: () => void): void {
    if (this.callbackError) return;
    this.callbackError = { error };
    detach();
  }
}

/**
 * A process started with `background: true`, or reattached with {@link Commands.connect}: its
 * output so far, `wait()` for its end, `kill()`, stdin. `disconnect()` stops watching it and
 * leaves it running.
 */
export class CommandHandle<O extends Output = string> implements AsyncDisposable {
  /** Its pid in the guest. */
  readonly pid: number;
  private readonly out: OutputBuffer<O>;
  private readonly err: OutputBuffer<O>;
  private readonly output: CommandOutput<O>;
  private exit: ExitInfo | undefined;
  private readonly result: Promise<CommandResult<O>>;

  /** @internal built by Commands */
  constructor(
    pid: number,
    private readonly session: ExecSession,
    private readonly control: ProcessControl,
    private readonly label: string,
    private readonly throwOnError: boolean,
    output: CommandOutput<O>,
  ) {
    this.pid = pid;
    this.output = output;
    this.out = output.out;
    this.err = output.err;
    this.result = session.exited.then((info) => {
      this.exit = info;
      this.out.finish();
      this.err.finish();
      return this.toResult(info);
    });
    this.result.catch(() => undefined);
  }

  /** Stdout received so far (up to maxBuffer). */
  get stdout(): O {
    return this.out.value;
  }
  /** Stderr received so far (up to maxBuffer). */
  get stderr(): O {
    return this.err.value;
  }
  /** undefined while the process runs. */
  get exitCode(): number | undefined {
    return this.exit?.exitCode;
  }
  /** E2B's words for how it ended ('exit status 3', 'signal: killed'); undefined while it runs
   *  or after exit 0. */
  get error(): string | undefined {
    if (!this.exit) return undefined;
    const { exitCode, signal } = this.exit;
    return exitCode !== 0 || signal ? exitErrorText(signal ? 128 + signal : exitCode, signal) : undefined;
  }
  /** Byte offsets of the next stdout / stderr byte this handle would receive: pass them as
   *  `commands.connect(pid, { fromOffset })` to continue with no gap and no duplicate. */
  get offsets(): {
    /** The next stdout byte's offset from the process start. */
    stdout: number;
    /** The next stderr byte's offset from the process start. */
    stderr: number;
  } {
    return { stdout: this.session.stdoutOffset, stderr: this.session.stderrOffset };
  }

  /** Waits for the process to end. Throws CommandExitError on a non-zero exit (unless the command
   *  was started with `throwOnError: false`), TimeoutError when it ran past `timeoutMs`, and
   *  OutputLimitError (OUTPUT_LIMIT, whatever throwOnError says) when stdout or stderr outgrew
   *  `maxBuffer`: the process was killed then, and the error carries the output kept.
   *
   * @param opts - `signal`: stop waiting when it aborts (the process runs on).
   * @returns Its exit code and its whole output.
   * @throws {@link CommandExitError} (COMMAND_EXIT) on a non-zero exit, unless `throwOnError: false`.
   * @throws {@link TimeoutError} (TIMEOUT) when it ran past `timeoutMs` and was killed.
   * @throws {@link OutputLimitError} (OUTPUT_LIMIT) when a stream outgrew `maxBuffer`.
   * @throws The error an onStdout / onStderr callback threw, when one did.
   * @throws {@link AbortError} (ABORTED) when `opts.signal` aborted the wait (the process runs on).
   */
  async wait(opts: { signal?: AbortSignal } = {}): Promise<CommandResult<O>> {
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, ['signal']);
    checkSignal('opts.signal', opts.signal);
    // An abort stops this wait only: the process runs on, and wait() may be called again.
    return abortable(this.waitForEnd(), opts.signal, `waiting for ${this.label}`, () => undefined);
  }

  private async waitForEnd(): Promise<CommandResult<O>> {
    let result: CommandResult<O>;
    try {
      result = await this.result;
    } catch (err) {
      // An onStdout/onStderr callback threw: that is the caller's error to see (as E2B).
      if (this.output.callbackError) throw this.output.callbackError.error;
      // The kill after an overflow failed and the session was dropped: still an OUTPUT_LIMIT.
      if (this.output.overflowed) throw this.limitError(this.output.killError ?? err);
      throw err;
    }
    if (this.output.callbackError) throw this.output.callbackError.error;
    if (this.output.overflowed) throw this.limitError();
    if (result.timedOut) {
      throw new TimeoutError(
        `${this.label} ran past its timeout and was killed. Raise timeoutMs (0 = none) or run it with background: true.`,
        { stdout: result.stdout, stderr: result.stderr },
      );
    }
    if (result.exitCode !== 0 && this.throwOnError) throw new CommandExitError<O>(result, this.label);
    return result;
  }

  /**
   * Sends SIGKILL (or `signal`) to the process group.
   *
   * @param signal - A signal name or number (default SIGKILL).
   * @returns true when it was signalled, false when the process is already gone.
   */
  kill(signal: NodeJS.Signals | number = 'SIGKILL'): Promise<boolean> {
    return this.control.kill(this.pid, signal);
  }
  /**
   * Writes to the process's stdin (started with `stdin: true`).
   *
   * @param data - A string (sent as UTF-8) or bytes.
   */
  sendStdin(data: string | Uint8Array): Promise<void> {
    return this.control.sendStdin(this.pid, data);
  }
  /** Closes the process's stdin (it reads end of file). */
  closeStdin(): Promise<void> {
    return this.control.closeStdin(this.pid);
  }

  /** Stops receiving output; the process keeps running (reattach with commands.connect). */
  async disconnect(): Promise<void> {
    this.session.detach();
  }

  /** What `await using` does at the end of its scope: kills the process if it still runs (its
   *  process group, SIGKILL) and stops receiving. Call `disconnect()` instead to leave it running. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.exit === undefined) await this.kill().catch(() => false);
    this.session.detach();
  }

  private limitError(cause?: unknown): OutputLimitError<O> {
    const stream = this.output.overflowed ?? 'stdout';
    const limit = this.output.maxBuffer;
    const killed = this.output.killError === undefined ? 'the process was killed' : 'killing the process failed';
    return new OutputLimitError(
      `${stream} of ${this.label} exceeded maxBuffer (${limit} bytes) and ${killed}. ` +
        'Raise the maxBuffer option (bytes kept per stream; Infinity = no limit), or redirect that output to a file in the guest.',
      { stream, maxBuffer: limit, stdout: this.out.value, stderr: this.err.value, ...(cause === undefined ? {} : { cause }) },
    );
  }

  private toResult(info: ExitInfo): CommandResult<O> {
    const r: CommandResult<O> = { exitCode: info.exitCode, stdout: this.out.value, stderr: this.err.value };
    if (info.signal) {
      r.signal = signalName(info.signal);
      if (info.exitCode === -1 || info.exitCode === 0) r.exitCode = 128 + info.signal;
    }
    if (info.timedOut) r.timedOut = true;
    if (r.exitCode !== 0 || r.signal) r.error = exitErrorText(r.exitCode, info.signal);
    return r;
  }
}

/** What Go's os/exec says about an exit (E2B's `error` field): 'exit status 3', 'signal: killed'. */
const goSignalText: Record<string, string> = {
  SIGHUP: 'hangup',
  SIGINT: 'interrupt',
  SIGQUIT: 'quit',
  SIGILL: 'illegal instruction',
  SIGTRAP: 'trace/breakpoint trap',
  SIGABRT: 'aborted',
  SIGBUS: 'bus error',
  SIGFPE: 'floating point exception',
  SIGKILL: 'killed',
  SIGUSR1: 'user defined signal 1',
  SIGSEGV: 'segmentation fault',
  SIGUSR2: 'user defined signal 2',
  SIGPIPE: 'broken pipe',
  SIGALRM: 'alarm clock',
  SIGTERM: 'terminated',
};
export function exitErrorText(exitCode: number, signal?: number): string {
  if (signal) {
    const name = signalName(signal);
    return `signal: ${goSignalText[name] ?? name}`;
  }
  return `exit status ${exitCode}`;
}

export function isProcessGone(err: unknown): boolean {
  return err instanceof TorporError && (err.code as string) === 'PROCESS_NOT_FOUND';
}
