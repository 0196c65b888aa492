// Starting several machines or sandboxes at once in a test: when one of them
// fails to start, the ones that did start must still be stopped, or they stay
// behind (live VMs, sandbox directories) and fail every later test of the file
// with a misleading error. Promise.all would drop them on the floor.

/**
 * Waits for every promise; if all fulfil, returns their values in order. If any
 * rejects, releases each fulfilled value with `release` (errors there are
 * ignored: the first start failure is what the test must report) and throws
 * the first rejection.
 */
export async function allOrNone<T>(starts: Promise<T>[], release: (value: T) => Promise<unknown>): Promise<T[]> {
  const settled = await Promise.allSettled(starts);
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (!failed) return settled.map((s) => (s as PromiseFulfilledResult<T>).value);
  await Promise.allSettled(
    settled.flatMap((s) => (s.status === 'fulfilled' ? [release(s.value)] : [])),
  );
  throw failed.reason;
}
