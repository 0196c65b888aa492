// The agent as an ordinary process on the host, over a Unix socket: how tests and benchmarks
// exercise the whole protocol and the commands/files API without a VM.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chown, mkdtemp, rm } from 'node:fs/promises';
import { connect as netConnect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { TorporError } from '../errors.js';
import { AgentClient, type AgentClientOptions } from './client.js';

const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Path of the host build of the agent (TORPOR_AGENT_BIN overrides). */
export function hostAgentBinary(): string {
  return process.env.TORPOR_AGENT_BIN ?? join(packageRoot, 'guest', 'agent', 'out', 'torpor-agent');
}

/** Opens a Unix socket to an agent and resolves once it is connected. */
export function dialUnix(socketPath: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = netConnect(socketPath);
    const onError = (err: Error) => {
      socket.destroy();
      reject(new TorporError('CONNECTION_CLOSED', `cannot connect to the agent at ${socketPath}: ${err.message}`, { cause: err }));
    };
    socket.once('error', onError);
    socket.once('connect', () => {
      socket.off('error', onError);
      socket.setNoDelay(true);
      resolve(socket);
    });
  });
}

/**
 * An AgentClient over a Unix socket; it redials the same path when `reconnect` is set.
 *
 * @param socketPath - The agent's socket.
 * @param opts - The client's options.
 * @throws {@link TorporError} CONNECTION_CLOSED when the socket cannot be reached; GUEST_UNRESPONSIVE when the agent does not answer HELLO.
 */
export function connectHostAgent(socketPath: string, opts: AgentClientOptions = {}): Promise<AgentClient> {
  return AgentClient.connect(() => dialUnix(socketPath), opts);
}

/** A plain environment for a host agent: without it every `bash -lc` command would run this
 *  machine's own login files (~/.bashrc with pyenv and the like), which is not what is measured
 *  or tested, and can stall (pyenv's rehash lock). */
export function plainAgentEnv(): NodeJS.ProcessEnv {
  return { PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin', HOME: tmpdir(), LANG: 'C.UTF-8' };
}

/** An agent running as a plain process on the host, as {@link startHostAgent} starts it. */
export interface HostAgent {
  /** The Unix socket it listens on. */
  socketPath: string;
  /** The agent's process id on the host. */
  pid: number;
  /** A new client session (its own connection). */
  client(opts?: AgentClientOptions): Promise<AgentClient>;
  /** The agent's last stderr output and, once it ended, its exit status (diagnostics). */
  diagnostics(): {
    /** Its last stderr output. */
    stderr: string;
    /** Its exit status, or the signal that ended it; null while it runs. */
    exit: number | string | null;
  };
  /** SIGTERM, wait for exit, remove the temporary directory. */
  stop(): Promise<void>;
}

/** Starts the real agent binary on a fresh Unix socket and waits for its readiness line. */
export async function startHostAgent(
  opts: {
    binary?: string;
    readyTimeoutMs?: number;
    /** Run the agent as this user (needs root). */
    uid?: number;
    gid?: number;
    /** The agent's environment, which its commands inherit (default: this process's). */
    env?: NodeJS.ProcessEnv;
    /** The agent's default user (`--user`): commands and file requests that name none act as
     *  it. Default: none, so they run as the agent's own user (the guest's image boot uses `user`). */
    user?: string;
  } = {},
): Promise<HostAgent> {
  const binary = opts.binary ?? hostAgentBinary();
  if (!existsSync(binary)) {
    throw new TorporError(
      'SETUP_FAILED',
      `the host build of the agent is missing at ${binary}; build it with \`make -C guest/agent\` (or set TORPOR_AGENT_BIN)`,
    );
  }
  const dir = await mkdtemp(join(tmpdir(), 'torpor-agent-'));
  const socketPath = join(dir, 'agent.sock');
  if (opts.uid !== undefined) await chown(dir, opts.uid, opts.gid ?? opts.uid);
  // TORPOR_AGENT_LOG=1 keeps the agent's log lines (diagnostics() shows the tail).
  const quiet = process.env.TORPOR_AGENT_LOG ? [] : ['--quiet'];
  const user = opts.user !== undefined ? ['--user', opts.user] : [];
  const child = spawn(binary, ['--listen', `unix:${socketPath}`, '--console', '-', ...quiet, ...user, '--subreaper'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: opts.env ?? process.env,
    ...(opts.uid !== undefined ? { uid: opts.uid, gid: opts.gid ?? opts.uid } : {}),
  });
  let stderrTail = '';
  child.stderr!.on('data', (d: Buffer) => {
    stderrTail = (stderrTail + d.toString()).slice(-4096);
  });
  try {
    await waitForReady(child, opts.readyTimeoutMs ?? 10_000, () => stderrTail);
  } catch (err) {
    child.kill('SIGKILL');
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  child.stdout!.resume();
  let stopped: Promise<void> | null = null;
  return {
    socketPath,
    pid: child.pid!,
    client: (clientOpts) => connectHostAgent(socketPath, clientOpts),
    diagnostics: () => ({ stderr: stderrTail, exit: child.signalCode ?? child.exitCode }),
    stop: () =>
      (stopped ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) {
          const exited = new Promise<void>((r) => child.once('exit', () => r()));
          child.kill('SIGTERM');
          const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
          await exited;
          clearTimeout(timer);
        }
        await rm(dir, { recursive: true, force: true });
      })()),
  };
}

function waitForReady(child: ChildProcess, timeoutMs: number, stderr: () => string): Promise<void> {
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => {
      cleanup();
      reject(new TorporError('GUEST_UNRESPONSIVE', `the host agent printed no readiness line within ${timeoutMs} ms: ${stderr()}`));
    }, timeoutMs);
    const onData = (d: Buffer) => {
      out += d.toString();
      if (/torpor-agent ready v\d+ /.test(out)) {
        cleanup();
        resolve();
      }
    };
    const onExit = (code: number | null, signal: string | null) => {
      cleanup();
      reject(new TorporError('SETUP_FAILED', `the host agent exited (${signal ?? code}) before it was ready: ${stderr()}`));
    };
    // spawn() itself failed (EACCES on a binary the agent's uid cannot reach, ENOENT): the
    // child emits 'error' and never 'exit'; unheard, that event would end the whole process.
    const onError = (err: NodeJS.ErrnoException) => {
      cleanup();
      reject(new TorporError('SETUP_FAILED', `cannot start the host agent: ${err.message}`, { cause: err, ...(err.errno !== undefined ? { errno: Math.abs(err.errno) } : {}) }));
    };
    const cleanup = () => {
      clearTimeout(timer);
      child.stdout!.off('data', onData);
      child.off('exit', onExit);
      child.off('error', onError);
    };
    child.stdout!.on('data', onData);
    child.on('exit', onExit);
    child.on('error', onError);
  });
}
