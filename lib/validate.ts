// Argument checks for every public entry point (Sandbox, Template, Machine, network options):
// each option is checked once, at the edge where the user hands it in, and a bad one is an
// INVALID_ARGUMENT raised before anything is sent or started, naming the option and what is
// expected, in one wording ("<what> must be <expected>; got <value>"). The layers below
// (lib/vm's native config, the addon, the VMM) take what passed here as given.
import { InvalidArgumentError } from './errors.js';

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

/** checkInt for a value that must be there: returns it. */
export function requireInt(what: string, value: unknown, min: number, max: number): number {
  if (value === undefined) fail(what, `an integer from ${min} to ${max}`, value);
  checkInt(what, value, min, max);
  return value;
}

/** checkString({ nonEmpty }) for a value that must be there: returns it. */
export function requireString(what: string, value: unknown): string {
  if (value === undefined) fail(what, 'a non-empty string', value);
  checkString(what, value, { nonEmpty: true });
  return value;
}

/** checkString for an optional value: returns it. */
export function optionalString(what: string, value: unknown): string | undefined {
  checkString(what, value);
  return value;
}

export function checkPath(what: string, value: unknown): asserts value is string {
  if (typeof value !== 'string' || value.length === 0) fail(what, 'a non-empty path string', value);
  if (value.includes('\0')) fail(what, 'a path without NUL characters', value);
  if (Buffer.byteLength(value) > 4096) fail(what, 'a path of at most 4096 bytes', `${value.slice(0, 40)}...`);
}

export function checkFunction(what: string, value: unknown): void {
  if (value !== undefined && typeof value !== 'function') fail(what, 'a function', value);
}

/** One of a fixed set of strings, or undefined. */
export function checkOneOf<T extends string>(what: string, value: unknown, allowed: readonly T[]): asserts value is T | undefined {
  if (value !== undefined && !allowed.includes(value as T)) fail(what, `one of ${allowed.map((a) => `'${a}'`).join(', ')}`, value);
}

/** An AbortSignal, or undefined. */
export function checkSignal(what: string, value: unknown): asserts value is AbortSignal | undefined {
  if (value !== undefined && !(value instanceof AbortSignal)) fail(what, 'an AbortSignal', value);
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
