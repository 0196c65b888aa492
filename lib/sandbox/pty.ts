// sbx.pty: interactive programs on a pseudo-terminal (E2B's words: create, sendInput, resize, kill).
import type { AgentClient } from '../agent/client.js';
import { FieldWriter } from '../agent/fields.js';
import { FrameType } from '../agent/protocol.js';
import type { CommandHandle, CommandResult } from './command-handle.js';
import type { Commands } from './commands.js';
import {
  callOpts,
  checkEnvs,
  checkFunction,
  checkInt,
  checkKnownKeys,
  checkObject,
  checkRequestOptions,
  checkString,
  fail,
  REQUEST_KEYS,
  type RequestOpts,
} from './validate.js';

/** A terminal's size in characters. */
export interface PtySize {
  /** Columns, 1 to 65535. */
  cols: number;
  /** Rows, 1 to 65535. */
  rows: number;
}

/** How {@link Pty.create} opens a terminal: its size and where its output goes are required. */
export interface PtyCreateOpts extends PtySize {
  /** Raw terminal output (the pty merges stdout and stderr). */
  onData: (data: Uint8Array) => void;
  /** Program to run; default an interactive login bash. */
  cmd?: string[];
  /** Default: the user's home. */
  cwd?: string;
  /** Default: the agent's default user (`user` in torpor's image, as E2B). */
  user?: string;
  /** Environment variables (TERM is xterm-256color unless given). */
  envs?: Record<string, string>;
  /** Kill after this long; default none. */
  timeoutMs?: number;
  /** How long to wait for the agent to start it (default: no limit). */
  requestTimeoutMs?: number;
  /** Abort the start: create() rejects with AbortError (ABORTED); a program that started as the abort came is killed. */
  signal?: AbortSignal;
}

/** A program running on a terminal, as {@link Pty.create} returns it; `await using` kills it at the end of its scope. */
export interface PtyHandle extends AsyncDisposable {
  /** The program's pid in the guest. */
  pid: number;
  /** Types into the terminal (keys, as text or bytes). */
  sendInput(data: string | Uint8Array): Promise<void>;
  /** Changes the terminal's size (the program gets SIGWINCH). */
  resize(size: PtySize): Promise<void>;
  /** Kills the program's process group (SIGKILL); false when it already ended. */
  kill(): Promise<boolean>;
  /** Resolves when the program exits (never throws for a non-zero exit). */
  wait(): Promise<CommandResult>;
  /** Stops receiving output; the program keeps running. */
  disconnect(): Promise<void>;
}

const KEYS = ['cols', 'rows', 'onData', 'cmd', 'cwd', 'user', 'envs', 'timeoutMs', ...REQUEST_KEYS] as const;

/** Interactive programs on a pseudo-terminal in the guest (`sbx.pty`). */
export class Pty {
  /** @internal */
  constructor(
    private readonly client: () => AgentClient,
    private readonly commands: Commands,
  ) {}

  /**
   * Starts a program (default an interactive login bash) on a new terminal.
   *
   * @param opts - The size, the output callback, and optionally the program, user, cwd, envs, timeouts.
   * @returns A handle to type into, resize, kill or wait for it.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for a missing size or callback, or a malformed option.
   * @throws {@link TimeoutError} (TIMEOUT) when the agent did not start it within `requestTimeoutMs`.
   */
  async create(opts: PtyCreateOpts): Promise<PtyHandle> {
    checkObject('opts', opts);
    if (!opts) fail('opts', 'an object with cols, rows and onData', opts);
    checkKnownKeys('opts', opts, KEYS);
    checkSize(opts);
    if (typeof opts.onData !== 'function') fail('opts.onData', 'a function', opts.onData);
    checkFunction('opts.onData', opts.onData);
    checkString('opts.cwd', opts.cwd, { nonEmpty: true });
    checkString('opts.user', opts.user, { nonEmpty: true });
    checkEnvs('opts.envs', opts.envs);
    checkInt('opts.timeoutMs', opts.timeoutMs, 0, 0xffffffff);
    checkRequestOptions(opts);
    if (opts.cmd !== undefined && (!Array.isArray(opts.cmd) || opts.cmd.length === 0)) fail('opts.cmd', 'a non-empty argv array', opts.cmd);
    opts.cmd?.forEach((a, i) => checkString(`opts.cmd[${i}]`, a));
    this.client().requireFeature('pty');
    const argv = opts.cmd ?? ['/bin/bash', '-i', '-l'];
    const envs = { TERM: 'xterm-256color', ...(opts.envs ?? {}) };
    const onData = opts.onData;
    const handle = (await this.commands.start(
      {
        argv,
        envs,
        ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}),
        ...(opts.user !== undefined ? { user: opts.user } : {}),
        ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs } : {}),
        pty: { rows: opts.rows, cols: opts.cols },
        stdin: true,
      },
      {
        throwOnError: false,
        ...(opts.requestTimeoutMs ? { requestTimeoutMs: opts.requestTimeoutMs } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
        raw: (data) => {
          try {
            onData(new Uint8Array(data.buffer, data.byteOffset, data.length));
          } catch {
            // a throwing callback must not break the stream
          }
        },
      },
      argv.join(' '),
    )) as CommandHandle;
    const pid = handle.pid;
    return {
      pid,
      sendInput: (data) => this.sendInput(pid, data),
      resize: (size) => this.resize(pid, size),
      kill: () => handle.kill(),
      wait: () => handle.wait(),
      disconnect: () => handle.disconnect(),
      [Symbol.asyncDispose]: () => handle[Symbol.asyncDispose](),
    };
  }

  /**
   * Types into the terminal of a program started with {@link Pty.create}.
   *
   * @param pid - The program's pid.
   * @param data - Keys, as text (UTF-8) or bytes.
   * @param opts - `requestTimeoutMs`.
   * @throws {@link TorporError} PROCESS_NOT_FOUND when there is no such program.
   */
  sendInput(pid: number, data: string | Uint8Array, opts: RequestOpts = {}): Promise<void> {
    return this.commands.sendStdin(pid, data, opts);
  }

  /**
   * Changes a terminal's size.
   *
   * @param pid - The program's pid.
   * @param size - The new columns and rows.
   * @param opts - `requestTimeoutMs`.
   * @throws {@link TorporError} PROCESS_NOT_FOUND when there is no such program.
   */
  async resize(pid: number, size: PtySize, opts: RequestOpts = {}): Promise<void> {
    checkInt('pid', pid, 1, 0xffffffff);
    checkObject('size', size);
    checkSize(size);
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, REQUEST_KEYS);
    checkRequestOptions(opts);
    const fw = new FieldWriter().u32('pid', pid).u32('pty_rows', size.rows).u32('pty_cols', size.cols);
    await this.client().call(FrameType.PTY_RESIZE, fw, callOpts(opts));
  }

  /**
   * Kills a terminal's program (SIGKILL to its process group).
   *
   * @param pid - The program's pid.
   * @param opts - `requestTimeoutMs`.
   * @returns true when it was killed, false when it had already ended.
   */
  kill(pid: number, opts: RequestOpts = {}): Promise<boolean> {
    return this.commands.kill(pid, opts);
  }
}

function checkSize(size: { cols?: unknown; rows?: unknown }): void {
  if (size.cols === undefined) fail('cols', 'an integer from 1 to 65535', undefined);
  if (size.rows === undefined) fail('rows', 'an integer from 1 to 65535', undefined);
  checkInt('cols', size.cols, 1, 65535);
  checkInt('rows', size.rows, 1, 65535);
}
