// Checks of the sandbox API's per-request options; the generic argument checks live in
// lib/validate.ts (re-exported here for the sandbox modules).
import { checkInt } from '../validate.js';

export {
  U32_MAX,
  checkBool,
  checkEnvs,
  checkFunction,
  checkInt,
  checkKnownKeys,
  checkMaxBuffer,
  checkObject,
  checkPath,
  checkString,
  fail,
} from '../validate.js';

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
