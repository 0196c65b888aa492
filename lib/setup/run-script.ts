// Runs a build script as a child process, line by line, keeping the tail of
// its output for the error message when it fails.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

import { TorporError } from '../errors.js';

export interface RunOptions {
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  onLine?: (line: string) => void;
  /** Also write every line to this file descriptor-less sink (a log array), e.g. for a build log. */
  log?: (line: string) => void;
  /** Lines kept for the error message. */
  tailLines?: number;
  /** What is being built, for the error message. */
  what: string;
}

export async function runScript(command: string, args: string[], options: RunOptions): Promise<void> {
  const tail: string[] = [];
  const keep = options.tailLines ?? 30;
  const child = spawn(command, args, {
    cwd: options.cwd,
    env: options.env ?? process.env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const onLine = (line: string): void => {
    tail.push(line);
    if (tail.length > keep) tail.shift();
    options.log?.(line);
    options.onLine?.(line);
  };
  createInterface({ input: child.stdout }).on('line', onLine);
  createInterface({ input: child.stderr }).on('line', onLine);
  const code = await new Promise<number | string>((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (c, signal) => resolve(c ?? signal ?? -1));
  }).catch((err: NodeJS.ErrnoException) => {
    throw new TorporError('SETUP_FAILED', `${options.what}: cannot run ${command}: ${err.message}`, { cause: err });
  });
  if (code !== 0) {
    throw new TorporError(
      'SETUP_FAILED',
      `${options.what} failed (${command} exited with ${code}). Last output:\n${tail.join('\n')}`,
    );
  }
}
