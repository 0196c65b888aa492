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
import { checkBool, checkEnvs, checkInt, checkKnownKeys, checkObject, checkSignal, checkString, fail } from './validate.js';

const OPT_KEYS = ['template', 'resources', 'vcpus', 'memoryMiB', 'envs', 'metadata', 'boot', 'timeoutMs', 'lifecycle', 'network', 'onDispose', 'signal'] as const;

function checkOnDispose(what: unknown): void {
  if (what !== undefined && what !== 'kill' && what !== 'pause') fail('opts.onDispose', "'kill' or 'pause'", what);
}

/** E2B's create options that mean nothing here (no service, no account): ignored, with a warning once per process. */
const E2B_IGNORED = ['apiKey', 'domain', 'secure'] as const;
const warned = new Set<string>();

/**
 * Sandbox.create's arguments as one options object: E2B's `create(template, opts)` form, and
 * E2B's names `cpuCount`/`memoryMB` as the aliases `vcpus`/`memoryMiB` (the same value twice is
 * fine, two different values are INVALID_ARGUMENT); E2B's keys with no meaning here are dropped
 * with a one-time warning. Everything else is left for checkCreateOpts.
 */
export function normalizeCreateArgs(first: unknown, second: unknown): SandboxOpts {
  let opts: Record<string, unknown>;
  if (typeof first === 'string') {
    checkObject('opts', second);
    opts = { ...((second as Record<string, unknown> | undefined) ?? {}) };
    if (opts.template !== undefined && opts.template !== first) fail('opts.template', `absent or equal to the template argument (${JSON.stringify(first)})`, opts.template);
    opts.template = first;
  } else {
    if (second !== undefined) fail('opts', 'the only argument unless the first is a template name', second);
    checkObject('opts', first);
    opts = { ...((first as Record<string, unknown> | undefined) ?? {}) };
  }
  for (const [e2b, ours] of [['cpuCount', 'vcpus'], ['memoryMB', 'memoryMiB']] as const) {
    if (!(e2b in opts)) continue;
    if (opts[ours] !== undefined && opts[ours] !== opts[e2b]) fail(`opts.${e2b}`, `equal to opts.${ours} (${String(opts[ours])}) when both are given`, opts[e2b]);
    if (opts[e2b] !== undefined) opts[ours] = opts[e2b];
    delete opts[e2b];
  }
  for (const key of E2B_IGNORED) {
    if (!(key in opts)) continue;
    delete opts[key];
    if (warned.has(key)) continue;
    warned.add(key);
    process.emitWarning(`Sandbox.create: E2B's option '${key}' has no meaning in torpor (sandboxes run in this process, not a service) and is ignored`, { code: 'TORPOR_E2B_OPTION' });
  }
  return opts as SandboxOpts;
}

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
  checkKnownKeys('opts.lifecycle', opts.lifecycle, ['onTimeout', 'autoResume']);
  const onTimeout = opts.lifecycle?.onTimeout;
  if (onTimeout !== undefined && onTimeout !== 'pause' && onTimeout !== 'kill') fail('opts.lifecycle.onTimeout', "'pause' or 'kill'", onTimeout);
  checkBool('opts.lifecycle.autoResume', opts.lifecycle?.autoResume);
  if (opts.lifecycle?.autoResume && onTimeout !== 'pause') fail('opts.lifecycle.autoResume', "used with onTimeout: 'pause' (only an idle pause resumes by itself)", true);
  checkSignal('opts.signal', opts.signal);
  checkObject('opts.boot', opts.boot);
  checkKnownKeys('opts.boot', opts.boot, ['kernel', 'cmdlineExtra', 'timeoutMs']);
  checkString('opts.boot.kernel', opts.boot?.kernel, { nonEmpty: true });
  checkString('opts.boot.cmdlineExtra', opts.boot?.cmdlineExtra);
  checkInt('opts.boot.timeoutMs', opts.boot?.timeoutMs, 1, 2 ** 31 - 1);
  if (opts.boot?.kernel !== undefined && !existsSync(opts.boot.kernel)) fail('opts.boot.kernel', 'an existing file', opts.boot.kernel);
  resolveNetwork('opts.network', opts.network);
  checkOnDispose(opts.onDispose);
}

export function checkConnectOpts(opts: ConnectOpts): void {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, ['onResume', 'restoreTimeoutMs', 'bootTimeoutMs', 'onDispose', 'onOwnerDeath', 'signal', 'checkpoint']);
  const c = opts.checkpoint;
  if (c !== undefined && !(typeof c === 'string' && c.length > 0) && !(Number.isSafeInteger(c) && (c as number) > 0) && !(typeof c === 'object' && c !== null && Number.isSafeInteger(c.id) && c.id > 0)) {
    fail('opts.checkpoint', 'a checkpoint id, a label, or what checkpoint() returned', c);
  }
  checkSignal('opts.signal', opts.signal);
  if (opts.onOwnerDeath !== undefined && opts.onOwnerDeath !== 'disk' && opts.onOwnerDeath !== 'memory') fail('opts.onOwnerDeath', "'disk' or 'memory'", opts.onOwnerDeath);
  checkOnDispose(opts.onDispose);
  if (opts.onResume !== undefined && opts.onResume !== 'restore' && opts.onResume !== 'reboot') fail('opts.onResume', "'restore' or 'reboot'", opts.onResume);
  checkInt('opts.restoreTimeoutMs', opts.restoreTimeoutMs, 1, 2 ** 31 - 1);
  checkInt('opts.bootTimeoutMs', opts.bootTimeoutMs, 1, 2 ** 31 - 1);
}

/** Sandbox.list's filters, from its own keys or E2B's `query`: the states wanted (null: any) and the metadata. */
export function listFilter(opts: ListOpts & { query?: ListOpts }): { states: SandboxState[] | null; metadata: Record<string, string> | undefined; limit: number } {
  checkObject('opts', opts);
  checkKnownKeys('opts', opts, ['state', 'metadata', 'query', 'limit']);
  const query: ListOpts | undefined = opts.query;
  checkObject('opts.query', query as unknown);
  checkKnownKeys('opts.query', query, ['state', 'metadata']);
  checkInt('opts.limit', opts.limit, 1, 2 ** 31 - 1);
  const state = opts.state ?? query?.state;
  const metadata = opts.metadata ?? query?.metadata;
  checkEnvs('opts.metadata', metadata);
  const states = state === undefined ? null : Array.isArray(state) ? state : [state];
  for (const s of states ?? []) if (!isSandboxState(s)) fail('opts.state', `one of ${SANDBOX_STATES.join(', ')}`, s);
  return { states, metadata, limit: opts.limit ?? 100 };
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
