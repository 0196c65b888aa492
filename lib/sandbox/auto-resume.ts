// lifecycle.autoResume: a sandbox its idle timer paused is resumed by the next call on its
// commands, files or pty, in its process, before the call runs. The three objects are wrapped
// so that each of their methods first asks the sandbox whether to resume.

/**
 * `target` with every method preceded by `first()`: null goes straight on (the sandbox runs, the
 * common case, with no extra await); a promise is waited for, and the method runs after it. A
 * method called through it returns a promise when it had to wait: every public method of the
 * three objects is asynchronous.
 */
export function resumingOnCall<T extends object>(target: T, first: () => Promise<void> | null): T {
  return new Proxy(target, {
    get(t, key) {
      const value: unknown = Reflect.get(t, key, t);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        const wait = first();
        return wait ? wait.then(() => Reflect.apply(value, t, args)) : Reflect.apply(value, t, args);
      };
    },
  });
}
