// Checks of the sandbox API's per-request options; the generic argument checks live in
// lib/validate.ts (re-exported here for the sandbox modules).
import { checkInt, checkSignal } from '../validate.js';

export {
  U32_MAX,
  checkBool,
  checkEnvs,
  checkFunction,
  checkInt,
  checkKnownKeys,
  checkMaxBuffer,
  checkObject,
  checkOneOf,
  checkPath,
  checkSignal,
  checkString,
  fail,
} from '../validate.js';

/** The per-request options, accepted by every call that is one request. */
export interface RequestOpts {
  /** Give up waiting for the agent's answer after this long (TimeoutError, code TIMEOUT; E2B's option). */
  requestTimeoutMs?: number;
  /** Abort the call: it rejects with {@link AbortError} (code ABORTED) and what it started is
   *  undone (a command is killed, a file write leaves no file). */
  signal?: AbortSignal;
}

/** The keys of {@link RequestOpts}, for checkKnownKeys. */
export const REQUEST_KEYS = ['requestTimeoutMs', 'signal'] as const;

export function checkRequestOptions(opts: RequestOpts): void {
  checkInt('opts.requestTimeoutMs', opts.requestTimeoutMs, 0, 2 ** 31 - 1);
  checkSignal('opts.signal', opts.signal);
}

/** AgentClient.call options for the request options (a timeout of 0 or none: no limit). */
export function callOpts(opts: RequestOpts): { timeoutMs?: number; signal?: AbortSignal } {
  return { ...(opts.requestTimeoutMs ? { timeoutMs: opts.requestTimeoutMs } : {}), ...(opts.signal ? { signal: opts.signal } : {}) };
}
