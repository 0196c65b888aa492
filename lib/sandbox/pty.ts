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
  checkRequestTimeout,
  checkString,
  fail,
  type RequestOpts,
} from './validate.js';

export interface PtySize {
  cols: number;
  rows: number;
}

export interface PtyCreateOpts extends PtySize {
  /** Raw terminal output (the pty merges stdout and stderr). */
  onData: (data: Uint8Array) => void;
  /** Program to run; default an interactive login bash. */
  cmd?: string[];
  /** Default: the user's home. */
  cwd?: string;
  /** Default: the agent's default user (`user` in torpor's image, as E2B). */
  user?: string;
  envs?: Record<string, string>;
  /** Kill after this long; default none. */
  timeoutMs?: number;
  /** How long to wait for the agent to start it (default: no limit). */
  requestTimeoutMs?: number;
}

export interface PtyHandle {
  pid: number;
  sendInput(data: string | Uint8Array): Promise<void>;
  resize(size: PtySize): Promise<void>;
  kill(): Promise<boolean>;
  /** Resolves when the program exits (never throws for a non-zero exit). */
  wait(): Promise<CommandResult>;
  /** Stops receiving output; the program keeps running. */
  disconnect(): Promise<void>;
}

const KEYS = ['cols', 'rows', 'onData', 'cmd', 'cwd', 'user', 'envs', 'timeoutMs', 'requestTimeoutMs'] as const;

export class Pty {
  /** @internal */
  constructor(
    private readonly client: () => AgentClient,
    private readonly commands: Commands,
  ) {}

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
    checkRequestTimeout(opts);
    if (opts.cmd !== undefined && (!Array.isArray(opts.cmd) || opts.cmd.length === 0)) fail('opts.cmd', 'a non-empty argv array', opts.cmd);
    opts.cmd?.forEach((a, i) => checkString(`opts.cmd[${i}]`, a));
    this.client().requireFeature('pty');
    const argv = opts.cmd ?? ['/bin/bash', '-i', '-l'];
    const envs = { TERM: 'xterm-256color', ...(opts.envs ?? {}) };
    const onData = opts.onData;
    const handle: CommandHandle = await this.commands.start(
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
        raw: (data) => {
          try {
            onData(new Uint8Array(data.buffer, data.byteOffset, data.length));
          } catch {
            // a throwing callback must not break the stream
          }
        },
      },
      argv.join(' '),
    );
    const pid = handle.pid;
    return {
      pid,
      sendInput: (data) => this.sendInput(pid, data),
      resize: (size) => this.resize(pid, size),
      kill: () => handle.kill(),
      wait: () => handle.wait(),
      disconnect: () => handle.disconnect(),
    };
  }

  sendInput(pid: number, data: string | Uint8Array, opts: RequestOpts = {}): Promise<void> {
    return this.commands.sendStdin(pid, data, opts);
  }

  async resize(pid: number, size: PtySize, opts: RequestOpts = {}): Promise<void> {
    checkInt('pid', pid, 1, 0xffffffff);
    checkObject('size', size);
    checkSize(size);
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, ['requestTimeoutMs']);
    checkRequestTimeout(opts);
    const fw = new FieldWriter().u32('pid', pid).u32('pty_rows', size.rows).u32('pty_cols', size.cols);
    await this.client().call(FrameType.PTY_RESIZE, fw, callOpts(opts));
  }

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
