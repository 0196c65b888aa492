// The options of Sandbox.create, connect, list and setTimeout, checked at the public edge
// (INVALID_ARGUMENT naming the option), and what a sandbox's options make of every command.
import { existsSync } from 'node:fs';

import { resolveNetwork } from '../net/options.js';
import type { SandboxMeta } from '../store/sandbox-dir.js';
import { checkResources } from '../template/resources.js';
import { parseImageUser } from '../template/user.js';
import type { CommandDefaults } from './commands.js';
import { SANDBOX_STATES, isSandboxState, type SandboxState } from './lifecycle.js';
import type { ConnectOpts } from './resume.js';
import type { ListOpts, SandboxOpts } from './sandbox.js';
import { checkEnvs, checkInt, checkKnownKeys, checkObject, checkString, fail } from './validate.js';

const OPT_KEYS = ['template', 'resources', 'vcpus', 'memoryMiB', 'envs', 'metadata', 'boot', 'timeoutMs', 'lifecycle', 'network'] as const;

export function checkCreateOpts(opts: SandboxOpts): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, OPT_KEYS);
  if (opts.template !== false) checkString('opts.template', opts.template, { nonEmpty: true });
  checkResources('opts.resources', opts.resources);
  checkInt('opts.vcpus', opts.vcpus, 1, 64);
  checkInt('opts.memoryMiB', opts.memoryMiB, 64, 256 * 1024);
  checkEnvs('opts.envs', opts.envs);
  checkEnvs('opts.metadata', opts.metadata);
  checkInt('opts.timeoutMs', opts.timeoutMs, 1, 2 ** 31 - 1);
  checkObject('opts.lifecycle', opts.lifecycle);
  checkKnownKeys('opts.lifecycle', opts.lifecycle, ['onTimeout']);
  const onTimeout = opts.lifecycle?.onTimeout;
  if (onTimeout !== undefined && onTimeout !== 'pause' && onTimeout !== 'kill') fail('opts.lifecycle.onTimeout', "'pause' or 'kill'", onTimeout);
  checkObject('opts.boot', opts.boot);
  checkKnownKeys('opts.boot', opts.boot, ['kernel', 'cmdlineExtra', 'timeoutMs']);
  checkString('opts.boot.kernel', opts.boot?.kernel, { nonEmpty: true });
  checkString('opts.boot.cmdlineExtra', opts.boot?.cmdlineExtra);
  checkInt('opts.boot.timeoutMs', opts.boot?.timeoutMs, 1, 2 ** 31 - 1);
  if (opts.boot?.kernel !== undefined && !existsSync(opts.boot.kernel)) fail('opts.boot.kernel', 'an existing file', opts.boot.kernel);
  resolveNetwork('opts.network', opts.network);
}

export function checkConnectOpts(opts: ConnectOpts): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, ['onResume', 'restoreTimeoutMs', 'bootTimeoutMs']);
  if (opts.onResume !== undefined && opts.onResume !== 'restore' && opts.onResume !== 'reboot') fail('opts.onResume', "'restore' or 'reboot'", opts.onResume);
  checkInt('opts.restoreTimeoutMs', opts.restoreTimeoutMs, 1, 2 ** 31 - 1);
  checkInt('opts.bootTimeoutMs', opts.bootTimeoutMs, 1, 2 ** 31 - 1);
}

/** Sandbox.list's filters, from its own keys or E2B's `query`: the states wanted (null: any) and the metadata. */
export function listFilter(opts: ListOpts & { query?: ListOpts }): { states: SandboxState[] | null; metadata: Record<string, string> | undefined } {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, ['state', 'metadata', 'query']);
  const query: ListOpts | undefined = opts.query;
  checkObject('opts.query', query as unknown);
  checkKnownKeys('opts.query', query, ['state', 'metadata']);
  const state = opts.state ?? query?.state;
  const metadata = opts.metadata ?? query?.metadata;
  checkEnvs('opts.metadata', metadata);
  const states = state === undefined ? null : Array.isArray(state) ? state : [state];
  for (const s of states ?? []) if (!isSandboxState(s)) fail('opts.state', `one of ${SANDBOX_STATES.join(', ')}`, s);
  return { states, metadata };
}

export function checkSetTimeout(timeoutMs: number, opts: { onTimeout?: unknown }): void {
  checkInt('timeoutMs', timeoutMs, 0, 2 ** 31 - 1);
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, ['onTimeout']);
  if (opts.onTimeout !== undefined && opts.onTimeout !== 'pause' && opts.onTimeout !== 'kill') fail('opts.onTimeout', "'pause' or 'kill'", opts.onTimeout);
}

/** The defaults every command of a sandbox gets: its envs, and its template's user and directory. */
export function commandDefaultsOf(meta: SandboxMeta): CommandDefaults {
  return {
    ...(Object.keys(meta.envs).length ? { envs: meta.envs } : {}),
    ...(meta.defaults?.user ? parseImageUser(meta.defaults.user) : {}),
    ...(meta.defaults?.cwd ? { cwd: meta.defaults.cwd } : {}),
  };
}
