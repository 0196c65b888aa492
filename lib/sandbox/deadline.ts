// E2B's requestTimeoutMs: a request's answer raced against a timer. On time-out the request is
// abandoned (cancelled, detached) and the caller gets a TimeoutError (code TIMEOUT). The caller's
// AbortSignal the same way: abandoned, and an AbortError (code ABORTED).
import { TimeoutError, abortError } from '../errors.js';

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

/** Throws the AbortError when `signal` has already aborted: a call checks before it starts anything. */
export function throwIfAborted(signal: AbortSignal | undefined, what: string): void {
  if (signal?.aborted) throw abortError(signal, what);
}

/** `work`, or ABORTED when `signal` aborts first, after `abandon` has undone or ended what `work`
 *  started (a promise it returns is waited for; its failure is not the caller's to see).
 *  Without a signal, `work` itself. */
export async function abortable<T>(
  work: Promise<T>,
  signal: AbortSignal | undefined,
  what: string,
  abandon: () => void | Promise<unknown>,
): Promise<T> {
  if (!signal) return work;
  work.catch(() => undefined); // lost the race: its later failure is nobody's to see
  const undo = () => Promise.resolve().then(abandon).catch(() => undefined);
  if (signal.aborted) {
    await undo();
    throw abortError(signal, what);
  }
  let onAbort!: () => void;
  let abortedFirst = false;
  // `work` settled first: an abort that comes before this call returns must not undo it.
  let workFirst = false;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => {
      if (workFirst) return;
      abortedFirst = true;
      void undo().then(() => reject(abortError(signal, what)));
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
  aborted.catch(() => undefined);
  // Once aborted, how `work` ends (often because `abandon` ended it) is not the answer: the abort is.
  const settled = work.then(
    (value) => {
      if (abortedFirst) return aborted;
      workFirst = true;
      return value;
    },
    (err: unknown) => {
      if (abortedFirst) return aborted;
      workFirst = true;
      return Promise.reject(err);
    },
  );
  try {
    return await Promise.race([settled, aborted]);
  } finally {
    signal.removeEventListener('abort', onAbort);
  }
}
