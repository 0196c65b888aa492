// A process stream: EXEC or ATTACH, then STARTED, STDOUT/STDERR {offset, data}, EXITED.
// Tracks the next expected byte offset of each output stream, so that a reattach (after a
// disconnect, a reconnect or a pause) resumes exactly where delivery stopped: bytes before the
// expected offset are dropped as duplicates; a jump past it is OUTPUT_LOST, never a silent gap.
import { TorporError } from '../errors.js';
import type { AgentClient } from './client.js';
import { FieldWriter, ProtocolError, type Fields } from './fields.js';
import { FLAG_END, FrameType, MAX_EXEC_PAYLOAD_BYTES } from './protocol.js';
import type { RequestStream } from './stream.js';

export interface ExecRequest {
  argv?: string[];
  shell?: string;
  envs?: Record<string, string>;
  cwd?: string;
  user?: string;
  uid?: number;
  gid?: number;
  timeoutMs?: number;
  pty?: { rows: number; cols: number };
  stdin?: boolean;
  tag?: string;
}

export interface ExitInfo {
  exitCode: number;
  /** Signal number when the process was killed by one. */
  signal?: number;
  /** The agent killed it because `timeoutMs` elapsed. */
  timedOut: boolean;
}

export interface StartInfo {
  pid: number;
  /** First stdout/stderr byte offsets the agent still keeps. */
  stdoutStart: number;
  stderrStart: number;
}

export interface ExecCallbacks {
  onStdout?(data: Buffer, offset: number): void;
  onStderr?(data: Buffer, offset: number): void;
}

export function execFields(req: ExecRequest): FieldWriter {
  const fw = new FieldWriter(MAX_EXEC_PAYLOAD_BYTES);
  if (req.argv) for (const a of req.argv) fw.str('arg', a);
  else if (req.shell !== undefined) fw.str('shell', req.shell);
  for (const [k, v] of Object.entries(req.envs ?? {})) fw.str('env', `${k}=${v}`);
  if (req.cwd !== undefined) fw.str('path', req.cwd);
  if (req.user !== undefined) fw.str('user', req.user);
  if (req.uid !== undefined) fw.u32('uid', req.uid);
  if (req.gid !== undefined) fw.u32('gid', req.gid);
  if (req.timeoutMs) fw.u32('timeout_ms', req.timeoutMs);
  if (req.pty) fw.u32('pty_rows', req.pty.rows).u32('pty_cols', req.pty.cols);
  if (req.stdin) fw.bool('stdin', true);
  if (req.tag !== undefined) fw.str('tag', req.tag);
  return fw;
}

export function attachFields(pid: number, stdoutOffset: number, stderrOffset: number): FieldWriter {
  return new FieldWriter().u32('pid', pid).u64('offset', stdoutOffset).u64('offset2', stderrOffset);
}

/** One live view of a process's output. Settles `started` then `exited` (or rejects both). */
export class ExecSession {
  readonly started: Promise<StartInfo>;
  readonly exited: Promise<ExitInfo>;
  pid: number | undefined;
  /** Next byte offset expected on stdout / stderr (= bytes delivered since the process start). */
  stdoutOffset: number;
  stderrOffset: number;
  private stream: RequestStream;
  private resolveStarted!: (s: StartInfo) => void;
  private rejectStarted!: (e: TorporError) => void;
  private resolveExited!: (e: ExitInfo) => void;
  private rejectExited!: (e: TorporError) => void;
  private detached = false;
  private exitSettled = false;

  private constructor(
    client: AgentClient,
    type: number,
    fields: FieldWriter,
    private readonly callbacks: ExecCallbacks,
    offsets: { stdout: number; stderr: number },
    pid?: number,
  ) {
    this.pid = pid;
    this.stdoutOffset = offsets.stdout;
    this.stderrOffset = offsets.stderr;
    this.started = new Promise((res, rej) => {
      this.resolveStarted = res;
      this.rejectStarted = rej;
    });
    this.exited = new Promise((res, rej) => {
      this.resolveExited = res;
      this.rejectExited = rej;
    });
    // Callers may only await one of them.
    this.started.catch(() => undefined);
    this.exited.catch(() => undefined);
    const execFieldsForReask = fields;
    this.stream = client.open(type, fields, {
      onFrame: (t, flags, f, s) => {
        this.frame(t, f, s);
        // The agent ended the stream without EXITED (or, for EXEC, without STARTED): the stream is
        // finished, so nothing else would ever settle the session (found by the host codec fuzzer).
        if (flags & FLAG_END && !this.exitSettled && !(t === FrameType.OK && f.bool('pending'))) {
          const err = new ProtocolError(`${type === FrameType.EXEC ? 'EXEC' : 'ATTACH'} stream ended without EXITED`);
          this.rejectStarted(err);
          this.rejectExited(err);
        }
      },
      onError: (err) => {
        this.rejectStarted(err);
        this.rejectExited(err);
      },
      reissue: () =>
        this.pid === undefined
          ? { type, fields: execFieldsForReask, sameRequestId: true }
          : { type: FrameType.ATTACH, fields: attachFields(this.pid, this.stdoutOffset, this.stderrOffset), sameRequestId: false },
    });
  }

  static exec(client: AgentClient, req: ExecRequest, callbacks: ExecCallbacks): ExecSession {
    return new ExecSession(client, FrameType.EXEC, execFields(req), callbacks, { stdout: 0, stderr: 0 });
  }

  static attach(
    client: AgentClient,
    pid: number,
    offsets: { stdout: number; stderr: number },
    callbacks: ExecCallbacks,
  ): ExecSession {
    return new ExecSession(client, FrameType.ATTACH, attachFields(pid, offsets.stdout, offsets.stderr), callbacks, offsets, pid);
  }

  /** Stops receiving output; the process keeps running. */
  detach(): void {
    if (this.detached) return;
    this.detached = true;
    this.stream.cancel();
    const err = new TorporError('CONNECTION_CLOSED', 'detached from the process');
    this.rejectStarted(err);
    this.rejectExited(err);
  }

  get isDetached(): boolean {
    return this.detached;
  }

  private frame(type: number, fields: Fields, stream: RequestStream): void {
    switch (type) {
      case FrameType.STARTED: {
        const pid = fields.u32('pid');
        if (pid === undefined) throw new ProtocolError('STARTED without pid');
        this.pid = pid;
        this.resolveStarted({
          pid,
          stdoutStart: fields.u64n('stdout_start') ?? 0,
          stderrStart: fields.u64n('stderr_start') ?? 0,
        });
        return;
      }
      case FrameType.STDOUT:
      case FrameType.STDERR: {
        const data = fields.bytes('data') ?? Buffer.alloc(0);
        const offset = fields.u64n('offset');
        const isOut = type === FrameType.STDOUT;
        const expected = isOut ? this.stdoutOffset : this.stderrOffset;
        const start = offset ?? expected;
        let fresh = data;
        if (start > expected) {
          stream.cancel();
          const err = new TorporError(
            'OUTPUT_LOST',
            `${isOut ? 'stdout' : 'stderr'} of pid ${this.pid} jumped from byte ${expected} to ${start}: output was dropped`,
          );
          this.rejectStarted(err);
          this.rejectExited(err);
          return;
        }
        if (start < expected) fresh = data.subarray(Math.min(expected - start, data.length)); // replayed bytes
        if (fresh.length > 0) {
          if (isOut) {
            this.stdoutOffset += fresh.length;
            this.callbacks.onStdout?.(fresh, this.stdoutOffset - fresh.length);
          } else {
            this.stderrOffset += fresh.length;
            this.callbacks.onStderr?.(fresh, this.stderrOffset - fresh.length);
          }
        }
        stream.consumed(data.length);
        return;
      }
      case FrameType.EXITED: {
        const signal = fields.u32('signal');
        const info: ExitInfo = { exitCode: fields.i32('exit_code') ?? -1, timedOut: fields.bool('timed_out') ?? false };
        if (signal) info.signal = signal;
        // ATTACH to an ended process may answer EXITED without STARTED; an EXEC may not.
        if (this.pid === undefined) throw new ProtocolError('EXITED before STARTED');
        this.resolveStarted({ pid: this.pid, stdoutStart: 0, stderrStart: 0 });
        this.exitSettled = true;
        this.resolveExited(info);
        return;
      }
      case FrameType.OK:
        // A re-asked EXEC still starting: ask again shortly.
        if (fields.bool('pending')) setTimeout(() => stream.askAgain(), 20);
        return;
      default:
        return;
    }
  }
}
