// Argument checks shared by the sandbox API: every bad option is an INVALID_ARGUMENT raised
// before anything is sent or started, naming the option and what is expected.
import { InvalidArgumentError } from '../errors.js';

export function fail(what: string, expected: string, got: unknown): never {
  const shown = typeof got === 'string' ? JSON.stringify(got.length > 60 ? got.slice(0, 57) + '...' : got) : String(got);
  throw new InvalidArgumentError(`${what} must be ${expected}; got ${shown}`);
}

export function checkObject(what: string, value: unknown): asserts value is Record<string, unknown> | undefined {
  if (value !== undefined && (typeof value !== 'object' || value === null || Array.isArray(value))) {
    fail(what, 'an object', value);
  }
}

export function checkKnownKeys(what: string, value: object | undefined, known: readonly string[]): void {
  if (!value) return;
  for (const key of Object.keys(value)) {
    if (!known.includes(key)) fail(`${what}.${key}`, `one of the known options (${known.join(', ')})`, key);
  }
}

export function checkInt(what: string, value: unknown, min: number, max: number): asserts value is number | undefined {
  if (value === undefined) return;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    fail(what, `an integer from ${min} to ${max}`, value);
  }
}

export function checkString(what: string, value: unknown, opts: { nonEmpty?: boolean } = {}): asserts value is string | undefined {
  if (value === undefined) return;
  if (typeof value !== 'string' || (opts.nonEmpty && value.length === 0)) {
    fail(what, opts.nonEmpty ? 'a non-empty string' : 'a string', value);
  }
  if (value.includes('\0')) fail(what, 'a string without NUL characters', value);
}

export function checkPath(what: string, value: unknown): asserts value is string {
  if (typeof value !== 'string' || value.length === 0) fail(what, 'a non-empty path string', value);
  if (value.includes('\0')) fail(what, 'a path without NUL characters', value);
  if (Buffer.byteLength(value) > 4096) fail(what, 'a path of at most 4096 bytes', `${value.slice(0, 40)}...`);
}

export function checkFunction(what: string, value: unknown): void {
  if (value !== undefined && typeof value !== 'function') fail(what, 'a function', value);
}

export function checkBool(what: string, value: unknown): void {
  if (value !== undefined && typeof value !== 'boolean') fail(what, 'a boolean', value);
}

export function checkEnvs(what: string, value: unknown): asserts value is Record<string, string> | undefined {
  checkObject(what, value);
  if (!value) return;
  for (const [k, v] of Object.entries(value)) {
    if (k.length === 0 || k.includes('=') || k.includes('\0')) fail(`${what} key`, 'a name without "=" or NUL', k);
    if (typeof v !== 'string') fail(`${what}.${k}`, 'a string', v);
    if (v.includes('\0')) fail(`${what}.${k}`, 'a string without NUL characters', v);
  }
}

/** A byte limit like Node's maxBuffer: an integer >= 0, or Infinity (no limit) said explicitly. */
export function checkMaxBuffer(what: string, value: unknown): void {
  if (value === undefined || value === Infinity) return;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) {
    fail(what, 'a byte count (an integer >= 0) or Infinity', value);
  }
}

export const U32_MAX = 0xffffffff;

/** E2B's per-request option, accepted by every call that is one request. */
export interface RequestOpts {
  /** Give up waiting for the agent's answer after this long (TimeoutError, code TIMEOUT). */
  requestTimeoutMs?: number;
}

export function checkRequestTimeout(opts: RequestOpts): void {
  checkInt('opts.requestTimeoutMs', opts.requestTimeoutMs, 0, 2 ** 31 - 1);
}

/** AgentClient.call options for a request option (0 or none: no limit). */
export function callOpts(opts: RequestOpts): { timeoutMs?: number } {
  return opts.requestTimeoutMs ? { timeoutMs: opts.requestTimeoutMs } : {};
}
