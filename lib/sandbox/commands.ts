// sbx.commands: run processes in the guest (E2B's words: run, list, connect, sendStdin, kill).
//
// The command is either a string, run with `/bin/bash -lc`, or an argv array, executed directly
// with no shell (faster, and no quoting):
//   await sbx.commands.run('echo $HOME | wc -c')
//   await sbx.commands.run(['python3', '-c', 'print(1+1)'])
import { constants } from 'node:os';

import { OutputLostError, TimeoutError, TorporError } from '../errors.js';
import type { AgentClient } from '../agent/client.js';
import { ExecSession, type ExecRequest, type StartInfo } from '../agent/exec.js';
import { abortable, throwIfAborted, withinMs } from './deadline.js';
import { FieldWriter } from '../agent/fields.js';
import { FLAG_END, FrameType, MAX_PAYLOAD_BYTES } from '../agent/protocol.js';
import {
  CommandHandle,
  CommandOutput,
  isProcessGone,
  type CommandResult,
  type Output,
  type OutputCallbacks,
  type OutputEncoding,
  type OutputOf,
  type ProcessControl,
} from './command-handle.js';
import {
  U32_MAX,
  checkBool,
  checkEnvs,
  checkFunction,
  checkInt,
  checkKnownKeys,
  checkMaxBuffer,
  checkObject,
  checkOneOf,
  checkRequestOptions,
  checkString,
  callOpts,
  fail,
  REQUEST_KEYS,
  type RequestOpts,
} from './validate.js';

export type { CommandResult, Output, OutputEncoding, OutputOf } from './command-handle.js';
export { CommandHandle } from './command-handle.js';

/** How {@link Commands.run} runs a command. Every field is optional. `E` is the output's
 *  encoding: strings for `'utf8'` (the default), Buffers for `'buffer'`. */
export interface CommandStartOpts<E extends OutputEncoding = 'utf8'> extends OutputCallbacks<OutputOf<E>> {
  /** Return a CommandHandle at once instead of waiting for the exit. */
  background?: boolean;
  /** Working directory (default: the template's, else the user's home). */
  cwd?: string;
  /** User name in the guest's /etc/passwd (uid, gid, groups and HOME follow; the working
   *  directory defaults to that user's home). Default: the agent's default user, `user`
   *  (uid 1000, /home/user) in torpor's image, as in E2B; `'root'` runs as root. */
  user?: string;
  /** Environment variables, added to the sandbox's and the template's (these win). */
  envs?: Record<string, string>;
  /** true: keep stdin open for sendStdin()/closeStdin(). A string or bytes: written to stdin, then closed. */
  stdin?: boolean | string | Uint8Array;
  /** Kill the process group after this long; 0 = never. Default 60 s in the foreground, none in the
   *  background (E2B applies 60 s to background commands too; torpor does not kill a server you
   *  started because you did not say how long it may live: pass timeoutMs to bound it). */
  timeoutMs?: number;
  /** How long to wait for the agent to start the process (E2B's option; default: no limit). */
  requestTimeoutMs?: number;
  /** Throw CommandExitError on a non-zero exit (default true). */
  throwOnError?: boolean;
  /** A label shown in commands.list(). */
  tag?: string;
  /** Bytes of stdout and of stderr (each, as UTF-8) kept for the result; default 64 MiB,
   *  `Infinity` for no limit. A stream that outgrows it gets the process killed (SIGKILL to its
   *  group) and the result rejected with OutputLimitError (code OUTPUT_LIMIT) carrying the
   *  output kept; onStdout/onStderr still see every byte up to the kill. Like Node's
   *  child_process.exec maxBuffer: a guest printing without end cannot exhaust host memory. */
  maxBuffer?: number;
  /** `'buffer'`: stdout and stderr (the result's, the handle's and the callbacks') are Buffers
   *  holding the bytes the process wrote, unchanged. Default `'utf8'`: strings (a byte sequence
   *  that is not UTF-8 becomes U+FFFD, so binary output is not kept). */
  encoding?: E;
  /** Abort the run: a foreground command's process group is killed and run() rejects with
   *  AbortError (ABORTED); for `background: true` it bounds the start only (a process started
   *  as the abort came is killed). */
  signal?: AbortSignal;
}

/** A process in the guest, as {@link Commands.list} reports it. */
export interface ProcessInfo {
  /** Its pid in the guest (what connect, sendStdin and kill take). */
  pid: number;
  /** The `tag` it was started with. */
  tag?: string;
  /** The program: argv[0], or '/bin/bash' for a shell string. */
  cmd: string;
  /** Its arguments after the program (`['-l', '-c', line]` for a shell string). */
  args: string[];
  /** The environment variables its start request set (not the whole environment it inherited). */
  envs: Record<string, string>;
  /** Its working directory, when one was given. */
  cwd?: string;
  /** false: it ended, and the agent still keeps its output (listed with `includeEnded`). */
  running: boolean;
  /** Its exit status, once it ended. */
  exitCode?: number;
}

/** How {@link Commands.connect} reattaches to a process. Every field is optional. */
export interface CommandConnectOpts<E extends OutputEncoding = 'utf8'> extends OutputCallbacks<OutputOf<E>> {
  /** Where output replay starts, per stream, as byte offsets from the process start:
   *  - a number: the stdout offset (stderr is omitted);
   *  - `{ stdout?, stderr? }`: each stream given (a handle's `offsets` gives both, for a resume
   *    with no gap and no duplicate).
   *  A given offset older than what the agent still keeps (it keeps the last 1 MiB per stream)
   *  throws OUTPUT_LOST. An omitted stream (or no fromOffset at all) resumes from the oldest byte
   *  still kept, and never throws OUTPUT_LOST for it (`handle.offsets` counts on from there). */
  fromOffset?:
    | number
    | {
        /** Byte offset into stdout. */
        stdout?: number;
        /** Byte offset into stderr. */
        stderr?: number;
      };
  /** wait() rejects with CommandExitError on a non-zero exit (default true). */
  throwOnError?: boolean;
  /** As for commands.run: bytes of each stream kept for wait(), replay included (default 64 MiB). */
  maxBuffer?: number;
  /** How long to wait for the agent to attach (default: no limit). */
  requestTimeoutMs?: number;
  /** Stop receiving after this long: wait() rejects with TIMEOUT and the process keeps running
   *  (E2B's option; default, unlike E2B's 60 s: no limit). */
  timeoutMs?: number;
  /** As for commands.run: `'buffer'` delivers the bytes unchanged (default `'utf8'`). */
  encoding?: E;
  /** Abort the attaching: connect() rejects with AbortError (ABORTED); the process runs on. */
  signal?: AbortSignal;
}

export type { RequestOpts } from './validate.js';

const RUN_KEYS = [
  'background',
  'cwd',
  'user',
  'envs',
  'stdin',
  'timeoutMs',
  'throwOnError',
  'tag',
  'onStdout',
  'onStderr',
  'maxBuffer',
  ...REQUEST_KEYS,
  'encoding',
] as const;
const CONNECT_KEYS = ['fromOffset', 'throwOnError', 'onStdout', 'onStderr', 'maxBuffer', 'timeoutMs', 'encoding', ...REQUEST_KEYS] as const;
const ENCODINGS: readonly OutputEncoding[] = ['utf8', 'buffer'];
/** Default maxBuffer: generous for real command output, far below what would hurt the host. */
export const DEFAULT_MAX_BUFFER = 64 * 1024 * 1024;
const DEFAULT_FOREGROUND_TIMEOUT_MS = 60_000;
const MAX_TIMER_MS = 2 ** 31 - 1;

/** How long past its timeoutMs the host still waits for a foreground command's end: the agent's
 *  kill, the process group's exit and the report crossing vsock take milliseconds on a healthy
 *  guest, seconds on a loaded or emulated one. A quarter of the timeout, 5 to 30 s. */
export function exitReportGraceMs(timeoutMs: number): number {
  return Math.min(30_000, Math.max(5_000, Math.round(timeoutMs / 4)));
}
const STDIN_CHUNK = 64 * 1024;
/** How long an abort waits for the kill of what it ends. */
const ABORT_KILL_TIMEOUT_MS = 5_000;

/** Settings every command of a sandbox inherits (a command's own options win). */
export interface CommandDefaults {
  /** Environment every command gets (a command's own envs win). */
  envs?: Record<string, string>;
  /** A template's user (an image's `User`): by name, or by number when the image gives one. */
  user?: string;
  /** The user by number (an image's numeric `User`). */
  uid?: number;
  /** The group by number (an image's `User` of the form 'uid:gid'). */
  gid?: number;
  /** A template's working directory (an image's `WorkingDir`). */
  cwd?: string;
}

/** What the owner of a Commands watches (a Sandbox: its pause waits for foreground runs). */
export interface CommandHooks {
  /** A foreground run (not `background`) began; `run` settles with it. */
  onForeground?(run: Promise<unknown>): void;
}

/**
 * Runs processes in the guest (`sbx.commands`): a string runs with `/bin/bash -l -c`, an argv
 * array runs directly, with no shell. In the foreground `run` resolves with the result; with
 * `background: true` it resolves with a {@link CommandHandle} at once.
 */
export class Commands implements ProcessControl {
  private readonly client: () => AgentClient;

  /** @internal built by createAgentApi / Sandbox */
  constructor(
    client: () => AgentClient,
    private readonly defaults: CommandDefaults = {},
    private readonly hooks: CommandHooks = {},
  ) {
    this.client = () => {
      const c = client();
      c.requireFeature('exec');
      return c;
    };
  }

  /**
   * Starts a command in the background.
   *
   * @param cmd - A shell line, or argv (no shell).
   * @param opts - With `background: true`; `encoding: 'buffer'` makes the output Buffers.
   * @returns A handle to the running process: `wait()` for its result, `kill()` to end it.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for an unknown or malformed option.
   * @throws {@link TimeoutError} (TIMEOUT) when the agent did not start it within `requestTimeoutMs`.
   */
  run<E extends OutputEncoding = 'utf8'>(
    cmd: string | string[],
    opts: CommandStartOpts<E> & { background: true },
  ): Promise<CommandHandle<OutputOf<E>>>;
  /**
   * Runs a command and waits for its end.
   *
   * @param cmd - A shell line (`/bin/bash -l -c`), or argv (no shell).
   * @param opts - Working directory, user, environment, stdin, timeout, output callbacks;
   *   `encoding: 'buffer'` makes the output Buffers.
   * @returns Its exit code and its whole stdout and stderr.
   * @throws {@link CommandExitError} (COMMAND_EXIT) on a non-zero exit, unless `throwOnError: false`.
   * @throws {@link TimeoutError} (TIMEOUT) past `timeoutMs` (default 60 s; the process group is killed).
   * @throws {@link OutputLimitError} (OUTPUT_LIMIT) when a stream outgrew `maxBuffer` (the process is killed).
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for an unknown or malformed option.
   * @throws {@link IllegalTransitionError} (INVALID_STATE) unless the sandbox is running.
   */
  run<E extends OutputEncoding = 'utf8'>(
    cmd: string | string[],
    opts?: CommandStartOpts<E> & { background?: false },
  ): Promise<CommandResult<OutputOf<E>>>;
  /**
   * Runs a command, in the foreground or (`background: true`) the background.
   *
   * @param cmd - A shell line, or argv (no shell).
   * @param opts - As the forms above take them.
   * @returns The result, or a handle for a background command.
   */
  run<E extends OutputEncoding = 'utf8'>(
    cmd: string | string[],
    opts?: CommandStartOpts<E>,
  ): Promise<CommandResult<OutputOf<E>> | CommandHandle<OutputOf<E>>>;
  run(cmd: string | string[], opts?: CommandStartOpts<OutputEncoding>): Promise<CommandResult<Output> | CommandHandle<Output>> {
    const run = this.runNow(cmd, opts);
    if (!opts?.background) this.hooks.onForeground?.(run);
    return run;
  }

  private async runNow(
    cmd: string | string[],
    opts: CommandStartOpts<OutputEncoding> = {},
  ): Promise<CommandResult<Output> | CommandHandle<Output>> {
    const request = toExecRequest(cmd, opts);
    const label = Array.isArray(cmd) ? cmd.join(' ') : cmd;
    throwIfAborted(opts.signal, label);
    const handle = await this.start(request, opts, label);
    // An abort from here on kills the process group, and sees it end, before the call rejects:
    // while stdin is written (a program that does not read it would hold the write), and while
    // a foreground run is waited for.
    const kill = async () => {
      await this.killQuickly(handle.pid);
      await withinMs(handle.wait(), ABORT_KILL_TIMEOUT_MS, label, () => undefined).catch(() => undefined);
    };
    const stdin = opts.stdin;
    if (typeof stdin === 'string' || stdin instanceof Uint8Array) {
      await abortable(this.writeAllStdin(handle.pid, stdin, !opts.background), opts.signal, label, kill);
    }
    if (opts.background) return handle;
    return abortable(this.waitForeground(handle, request, label), opts.signal, label, kill);
  }

  /** The `stdin` option's bytes written and stdin closed. For a foreground run, a program that
   *  exited without reading its input (`true`, `head -1`) is no error: its exit status is the
   *  answer then, not the failed write. Anything else is the caller's to see. */
  private async writeAllStdin(pid: number, data: string | Uint8Array, foreground: boolean): Promise<void> {
    try {
      await this.sendStdin(pid, data);
      await this.closeStdin(pid);
    } catch (err) {
      if (!foreground || !isStdinGone(err)) throw err;
    }
  }

  private waitForeground(handle: CommandHandle<Output>, request: ExecRequest, label: string): Promise<CommandResult<Output>> {
    // The agent kills the command at timeoutMs and reports its end. A guest that no longer
    // answers (a stuck kernel, a stalled vsock) would otherwise leave the caller waiting for
    // ever: past timeoutMs and a grace for the kill and its report, the host stops waiting.
    const timeout = request.timeoutMs;
    if (!timeout) return handle.wait();
    const grace = exitReportGraceMs(timeout);
    if (timeout + grace > MAX_TIMER_MS) return handle.wait(); // weeks: beyond what a timer holds
    return withinMs(
      handle.wait(),
      timeout + grace,
      label,
      () => void handle.disconnect(),
      `the guest's agent reported no end within timeoutMs (${timeout} ms) and ${grace} ms more to kill it: ` +
        'the guest may be stuck (this view of the command is closed; the process may still run)',
    );
  }

  /** SIGKILL to a process group an abort ends, bounded: a stuck agent must not hold the abort. */
  private killQuickly(pid: number): Promise<boolean> {
    return this.kill(pid, 'SIGKILL', { requestTimeoutMs: ABORT_KILL_TIMEOUT_MS }).catch(() => false);
  }

  /** Running processes (as E2B). `includeEnded: true` adds the recently ended ones the agent
   *  keeps for reattaching (with their exitCode).
   *
   * @param opts - `includeEnded`; `requestTimeoutMs`.
   * @returns One {@link ProcessInfo} per process.
   */
  async list(opts: RequestOpts & { includeEnded?: boolean } = {}): Promise<ProcessInfo[]> {
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, ['includeEnded', ...REQUEST_KEYS]);
    checkBool('opts.includeEnded', opts.includeEnded);
    checkRequestOptions(opts);
    const answer = await this.client().call(FrameType.PROC_LIST, new FieldWriter(), callOpts(opts));
    const all = answer.nested('entry').map((e) => {
      const argv = e.strs('arg');
      const shell = e.str('shell');
      const envs: Record<string, string> = {};
      for (const kv of e.strs('env')) {
        const i = kv.indexOf('=');
        if (i > 0) envs[kv.slice(0, i)] = kv.slice(i + 1);
      }
      const info: ProcessInfo = {
        pid: e.u32('pid') ?? 0,
        cmd: shell !== undefined ? '/bin/bash' : (argv[0] ?? ''),
        args: shell !== undefined ? ['-l', '-c', shell] : argv.slice(1),
        envs,
        running: e.bool('running') ?? false,
      };
      const tag = e.str('tag');
      if (tag) info.tag = tag;
      const cwd = e.str('path');
      if (cwd) info.cwd = cwd;
      const exitCode = e.i32('exit_code');
      if (exitCode !== undefined && !info.running) info.exitCode = exitCode;
      return info;
    });
    return opts.includeEnded ? all : all.filter((p) => p.running);
  }

  /** Reattaches to a process (running or recently ended), replaying kept output from the
   *  offsets in `opts.fromOffset` (see there). Throws OUTPUT_LOST when a given offset is older than
   *  what the agent kept.
   *
   * @param pid - The process's pid (from a handle, or {@link Commands.list}).
   * @param opts - Where to replay from, output callbacks, limits.
   * @returns A handle whose `wait()` gives the result, the replayed output included.
   * @throws {@link OutputLostError} (OUTPUT_LOST) when a given offset is older than what is kept.
   * @throws {@link TorporError} PROCESS_NOT_FOUND when the agent knows no such process.
   */
  async connect<E extends OutputEncoding = 'utf8'>(pid: number, opts?: CommandConnectOpts<E>): Promise<CommandHandle<OutputOf<E>>>;
  async connect(pid: number, opts: CommandConnectOpts<OutputEncoding> = {}): Promise<CommandHandle<Output>> {
    checkInt('pid', pid, 1, U32_MAX);
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, CONNECT_KEYS);
    checkOneOf('opts.encoding', opts.encoding, ENCODINGS);
    checkFunction('opts.onStdout', opts.onStdout);
    checkFunction('opts.onStderr', opts.onStderr);
    checkBool('opts.throwOnError', opts.throwOnError);
    checkMaxBuffer('opts.maxBuffer', opts.maxBuffer);
    checkRequestOptions(opts);
    checkInt('opts.timeoutMs', opts.timeoutMs, 0, 2 ** 31 - 1);
    let asked: { stdout?: number; stderr?: number } = {};
    if (typeof opts.fromOffset === 'number') {
      checkInt('opts.fromOffset', opts.fromOffset, 0, Number.MAX_SAFE_INTEGER);
      asked = { stdout: opts.fromOffset };
    } else if (opts.fromOffset !== undefined) {
      checkObject('opts.fromOffset', opts.fromOffset);
      checkKnownKeys('opts.fromOffset', opts.fromOffset, ['stdout', 'stderr']);
      checkInt('opts.fromOffset.stdout', opts.fromOffset.stdout, 0, Number.MAX_SAFE_INTEGER);
      checkInt('opts.fromOffset.stderr', opts.fromOffset.stderr, 0, Number.MAX_SAFE_INTEGER);
      if (opts.fromOffset.stdout !== undefined) asked.stdout = opts.fromOffset.stdout;
      if (opts.fromOffset.stderr !== undefined) asked.stderr = opts.fromOffset.stderr;
    }
    // First try: an omitted stream from 0, which is its oldest kept byte unless output was dropped.
    const first = { stdout: asked.stdout ?? 0, stderr: asked.stderr ?? 0 };
    const anyOmitted = asked.stdout === undefined || asked.stderr === undefined;
    try {
      return await this.attach(pid, first, opts);
    } catch (err) {
      if (!anyOmitted || !isOutputLost(err)) throw err;
    }
    // Output was dropped: look where the kept tails begin. A given offset before its tail is the
    // caller's OUTPUT_LOST; an omitted stream starts at its tail.
    for (let attempt = 0; ; attempt++) {
      const starts = await this.keptStarts(pid);
      for (const stream of ['stdout', 'stderr'] as const) {
        const want = asked[stream];
        if (want !== undefined && want < starts[stream]) {
          throw new OutputLostError(
            `${stream} of process ${pid} before byte ${starts[stream]} is no longer kept (asked from ${want}); ` +
              'omit the offset to resume from the oldest byte kept',
          );
        }
      }
      try {
        return await this.attach(pid, { stdout: asked.stdout ?? starts.stdout, stderr: asked.stderr ?? starts.stderr }, opts);
      } catch (err) {
        // The tail may move on between the two requests under heavy output: look again.
        if (!isOutputLost(err) || attempt >= 3) throw err;
      }
    }
  }

  private async attach(
    pid: number,
    offsets: { stdout: number; stderr: number },
    opts: CommandConnectOpts<OutputEncoding>,
  ): Promise<CommandHandle<Output>> {
    const client = this.client();
    client.requireFeature('attach');
    let session: ExecSession | undefined;
    const output = this.limitedOutput(true, opts.maxBuffer, () => session, opts.encoding);
    const failed = (err: unknown) => output.callbackFailed(err, () => session?.detach());
    session = ExecSession.attach(client, pid, offsets, {
      onStdout: (data) => deliver(opts.onStdout, output.out.push(data), failed),
      onStderr: (data) => deliver(opts.onStderr, output.err.push(data), failed),
    });
    const s = session;
    await abortable(startedWithin(s, opts.requestTimeoutMs, `attaching to process ${pid}`), opts.signal, `attaching to process ${pid}`, () =>
      s.detach(),
    );
    if (opts.timeoutMs) {
      const ms = opts.timeoutMs;
      const timer = setTimeout(
        () => failed(new TimeoutError(`connection to process ${pid} ended after timeoutMs (${ms} ms); the process keeps running`)),
        ms,
      );
      timer.unref?.();
      session.exited.then(() => clearTimeout(timer), () => clearTimeout(timer));
    }
    return new CommandHandle(pid, session, this, `process ${pid}`, opts.throwOnError ?? true, output);
  }

  /** Output kept up to maxBuffer per stream; past it, the process is killed (its EXITED then ends
   *  the session; should the kill fail, the session is dropped so wait() does not hang). */
  private limitedOutput(
    keep: boolean,
    maxBuffer: number | undefined,
    session: () => ExecSession | undefined,
    encoding: OutputEncoding = 'utf8',
  ): CommandOutput<Output> {
    const onLimit = () => {
      const s = session();
      if (s?.pid === undefined) return;
      this.kill(s.pid).catch((err: unknown) => {
        output.killError = err;
        s.detach();
      });
    };
    const output = new CommandOutput<Output>(keep, maxBuffer ?? DEFAULT_MAX_BUFFER, onLimit, encoding);
    return output;
  }

  /** Where the kept stdout/stderr tails begin: an ATTACH from beyond the end is always
   *  accepted and its STARTED reports stdout_start/stderr_start; it is then detached. */
  private async keptStarts(pid: number): Promise<{ stdout: number; stderr: number }> {
    const far = Number.MAX_SAFE_INTEGER;
    const probe = ExecSession.attach(this.client(), pid, { stdout: far, stderr: far }, {});
    try {
      const s = await probe.started;
      return { stdout: s.stdoutStart, stderr: s.stderrStart };
    } finally {
      probe.detach();
    }
  }

  /**
   * Writes to a process's stdin (the process must have been started with `stdin: true`).
   *
   * @param pid - The process's pid.
   * @param data - A string (sent as UTF-8) or bytes.
   * @param opts - `requestTimeoutMs`.
   * @throws {@link TorporError} PROCESS_NOT_FOUND when there is no such process; an error when its stdin is closed.
   */
  async sendStdin(pid: number, data: string | Uint8Array, opts: RequestOpts = {}): Promise<void> {
    checkInt('pid', pid, 1, U32_MAX);
    checkRequestOpts(opts);
    const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
    if (!(bytes instanceof Uint8Array)) fail('data', 'a string or a Uint8Array', data);
    for (let pos = 0; pos < bytes.length || (pos === 0 && bytes.length === 0); pos += STDIN_CHUNK) {
      const fw = new FieldWriter().u32('pid', pid).bytes('data', bytes.subarray(pos, pos + STDIN_CHUNK));
      await this.client().call(FrameType.STDIN, fw, callOpts(opts));
      if (bytes.length === 0) break;
    }
  }

  /**
   * Closes a process's stdin (it sees end of file).
   *
   * @param pid - The process's pid.
   * @param opts - `requestTimeoutMs`.
   * @throws {@link TorporError} PROCESS_NOT_FOUND when there is no such process.
   */
  async closeStdin(pid: number, opts: RequestOpts = {}): Promise<void> {
    checkInt('pid', pid, 1, U32_MAX);
    checkRequestOpts(opts);
    const fw = new FieldWriter().u32('pid', pid).bytes('data', new Uint8Array(0));
    await this.client().call(FrameType.STDIN, fw, { flags: FLAG_END, ...callOpts(opts) });
  }

  /**
   * Signals a process group (SIGKILL by default).
   *
   * @param pid - The process's pid.
   * @param signal - A name ('SIGTERM') or number; or, as E2B's `kill(pid, opts)`, the options.
   * @param opts - `requestTimeoutMs`.
   * @returns true when it was signalled, false when no such process is running.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for an unknown signal.
   */
  async kill(pid: number, signal: NodeJS.Signals | number | RequestOpts = 'SIGKILL', opts: RequestOpts = {}): Promise<boolean> {
    checkInt('pid', pid, 1, U32_MAX);
    // E2B's kill(pid, opts): an options object in the signal's place.
    if (typeof signal === 'object' && signal !== null) {
      opts = signal;
      signal = 'SIGKILL';
    }
    checkRequestOpts(opts);
    const num = typeof signal === 'number' ? signal : (constants.signals as Record<string, number>)[signal];
    if (num === undefined || !Number.isInteger(num) || num < 1 || num > 64) fail('signal', 'a signal name or number', signal);
    try {
      await this.client().call(FrameType.PROC_SIGNAL, new FieldWriter().u32('pid', pid).u32('signal', num), callOpts(opts));
      return true;
    } catch (err) {
      if (isProcessGone(err)) return false;
      throw err;
    }
  }

  /** @internal shared with Pty */
  async start(
    request: ExecRequest,
    opts: OutputCallbacks<Output> & {
      throwOnError?: boolean;
      maxBuffer?: number;
      requestTimeoutMs?: number;
      encoding?: OutputEncoding;
      signal?: AbortSignal;
      raw?: (data: Buffer) => void;
    },
    label: string,
  ): Promise<CommandHandle<Output>> {
    // An agent before the `users` feature takes exec strings of at most 64 KiB and requests of
    // at most 1 MiB (more would close its connection): say so here instead.
    const client = this.client();
    if (!client.supports('users')) {
      const strings = [...(request.argv ?? []), request.shell ?? '', ...Object.entries(request.envs ?? {}).map(([k, v]) => `${k}=${v}`)];
      const total = strings.reduce((n, x) => n + Buffer.byteLength(x) + 6, 0);
      if (strings.some((x) => Buffer.byteLength(x) > 64 * 1024) || total > MAX_PAYLOAD_BYTES - 4096) {
        fail('cmd', 'strings of at most 64 KiB each and 1 MiB in all for this agent (it predates the larger limits)', '(a longer command)');
      }
    }
    // The sandbox's envs reach every process it starts, commands and ptys alike.
    if (this.defaults.envs) request = { ...request, envs: { ...this.defaults.envs, ...(request.envs ?? {}) } };
    // The template's user and directory, unless the command names its own user (whose home is
    // then its directory, as for any user) or directory.
    const d = this.defaults;
    if (request.user === undefined && request.uid === undefined) {
      if (d.user !== undefined) request = { ...request, user: d.user };
      else if (d.uid !== undefined) request = { ...request, uid: d.uid, ...(d.gid !== undefined ? { gid: d.gid } : {}) };
      if (request.cwd === undefined && d.cwd) request = { ...request, cwd: d.cwd };
    }
    // A pty (raw) keeps no output: its bytes go to onData only.
    let session: ExecSession | undefined;
    const output = this.limitedOutput(opts.raw === undefined, opts.maxBuffer, () => session, opts.encoding);
    const failed = (err: unknown) => output.callbackFailed(err, () => session?.detach());
    session = ExecSession.exec(client, request, {
      onStdout: (data) => {
        if (opts.raw) return opts.raw(data);
        deliver(opts.onStdout, output.out.push(data), failed);
      },
      onStderr: (data) => deliver(opts.onStderr, output.err.push(data), failed),
    });
    const s = session;
    // Aborted while starting: once the agent says it started, the process is killed.
    const abandon = () => void s.started.then((info) => this.killQuickly(info.pid)).finally(() => s.detach()).catch(() => undefined);
    const started = await abortable(startedWithin(session, opts.requestTimeoutMs, `starting ${label}`), opts.signal, `starting ${label}`, abandon);
    return new CommandHandle(started.pid, session, this, label, opts.throwOnError ?? true, output);
  }
}

/** Calls a user's output callback. One that throws (or whose promise rejects) ends this view of
 *  the process: `failed` records the error, which wait()/run() then reject with (as E2B does);
 *  the process itself keeps running (commands.connect reattaches). */
function deliver(cb: ((piece: Output) => void | Promise<void>) | undefined, piece: Output, failed: (err: unknown) => void): void {
  if (!cb || piece.length === 0) return;
  try {
    const r = cb(piece);
    if (r && typeof (r as Promise<void>).catch === 'function') (r as Promise<void>).catch(failed);
  } catch (err) {
    failed(err);
  }
}

/** The session's STARTED, or TIMEOUT after `ms` (the session is dropped then). */
function startedWithin(session: ExecSession, ms: number | undefined, what: string): Promise<StartInfo> {
  return withinMs(session.started, ms, what, () => session.detach());
}

function checkRequestOpts(opts: RequestOpts): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, REQUEST_KEYS);
  checkRequestOptions(opts);
}



export function toExecRequest(cmd: string | string[], opts: CommandStartOpts<OutputEncoding>): ExecRequest {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, RUN_KEYS);
  const req: ExecRequest = {};
  if (typeof cmd === 'string') {
    // An empty (or blank) string runs, as in E2B: the shell exits 0.
    checkString('cmd', cmd);
    req.shell = cmd;
  } else if (Array.isArray(cmd)) {
    if (cmd.length === 0) fail('cmd', 'a non-empty argv array', '[]');
    cmd.forEach((a, i) => checkString(`cmd[${i}]`, a));
    if (cmd[0] === '') fail('cmd[0]', 'a program name or path', '');
    req.argv = [...cmd];
  } else {
    fail('cmd', 'a command string or an argv array', cmd);
  }
  checkBool('opts.background', opts.background);
  checkString('opts.cwd', opts.cwd, { nonEmpty: true });
  checkString('opts.user', opts.user, { nonEmpty: true });
  checkEnvs('opts.envs', opts.envs);
  checkInt('opts.timeoutMs', opts.timeoutMs, 0, U32_MAX);
  checkBool('opts.throwOnError', opts.throwOnError);
  checkString('opts.tag', opts.tag);
  if (opts.tag !== undefined && Buffer.byteLength(opts.tag) > 256) fail('opts.tag', 'at most 256 bytes', opts.tag);
  checkFunction('opts.onStdout', opts.onStdout);
  checkFunction('opts.onStderr', opts.onStderr);
  checkMaxBuffer('opts.maxBuffer', opts.maxBuffer);
  checkOneOf('opts.encoding', opts.encoding, ENCODINGS);
  checkRequestOptions(opts);
  if (opts.stdin !== undefined && typeof opts.stdin !== 'boolean' && typeof opts.stdin !== 'string' && !(opts.stdin instanceof Uint8Array)) {
    fail('opts.stdin', 'a boolean, a string or a Uint8Array', opts.stdin);
  }
  if (opts.cwd !== undefined) req.cwd = opts.cwd;
  if (opts.user !== undefined) req.user = opts.user;
  if (opts.envs) req.envs = opts.envs;
  if (opts.tag !== undefined) req.tag = opts.tag;
  if (opts.stdin !== undefined && opts.stdin !== false) req.stdin = true;
  const timeout = opts.timeoutMs ?? (opts.background ? 0 : DEFAULT_FOREGROUND_TIMEOUT_MS);
  if (timeout) req.timeoutMs = timeout;
  return req;
}

function isOutputLost(err: unknown): boolean {
  return err instanceof TorporError && err.code === 'OUTPUT_LOST';
}

/** Writing stdin failed because the process already closed it or ended. */
function isStdinGone(err: unknown): boolean {
  if (!(err instanceof TorporError)) return false;
  if ((err.code as string) === 'PROCESS_NOT_FOUND') return true;
  return err.code === 'REQUEST_FAILED' && /EPIPE|closed/.test(err.message);
}
