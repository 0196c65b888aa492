// E2B's requestTimeoutMs: a request's answer raced against a timer. On time-out the request is
// abandoned (cancelled, detached) and the caller gets a TimeoutError (code TIMEOUT).
import { TimeoutError } from '../errors.js';

/** `work`, or TIMEOUT after `ms` (0 or undefined: no limit), calling `abandon` first. The error
 *  says `${what}: ${why}` (by default, that requestTimeoutMs ran out). */
export async function withinMs<T>(
  work: Promise<T>,
  ms: number | undefined,
  what: string,
  abandon: () => void,
  why = `no answer from the agent within requestTimeoutMs (${ms} ms)`,
): Promise<T> {
  if (!ms) return work;
  work.catch(() => undefined); // lost the race: its later failure is nobody's to see
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      abandon();
      reject(new TimeoutError(`${what}: ${why}`));
    }, ms);
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
