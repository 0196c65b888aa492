// What happens to running sandboxes when this process ends (docs/architecture.md#durability-and-ownership):
// - machines never keep the event loop alive, so when nothing else is left to do Node emits
//   `beforeExit`: every sandbox still running is paused then (asynchronously; beforeExit comes
//   again once the pauses are done, and finds nothing left to pause);
// - SIGINT / SIGTERM: only with Sandbox.installSignalHandlers() (a library does not take a
//   process's signals by itself): the running sandboxes are paused, then the handler removes
//   itself and raises the signal again, so the process ends as it would have;
// - process.exit() (and an uncaught exception, which ends the process the same way): Node
//   runs `exit` handlers synchronously, with no event loop: each running sandbox is captured
//   there, on the JS thread (Machine.captureNow: pause bounded at 2 s, a generation written and
//   made durable, no guest `sync`: memory and disk taken at one instant are consistent) and its
//   meta.json says `paused`. The addon's cleanup hook then stops the machines.
// - a worker thread ending (worker.terminate() included: no JS runs): the addon's cleanup hook
//   captures the machine (Machine.captureOnTeardown, set while the sandbox runs) and then drops
//   the worker's owner locks; connect finds the generation newer than meta.json and continues it.
// - SIGKILL (or a capture that failed): nothing runs. The sandbox's directory keeps its last
//   generation and meta.json says `running`; the owner lock died with the process, so the next
//   Sandbox.connect restores that generation (getInfo().lostInterval says since when work was
//   lost).

/** What the registry needs of a sandbox. */
export interface Pausable {
  readonly sandboxId: string;
  isRunning(): boolean;
  pause(): Promise<unknown>;
  /** The synchronous capture of an ending process (best effort: it never throws). */
  captureOnExit(): void;
}

const running = new Set<Pausable>();
let beforeExitInstalled = false;

function pauseAll(): Promise<unknown> {
  return Promise.allSettled([...running].filter((s) => s.isRunning()).map((s) => s.pause()));
}

function onBeforeExit(): void {
  if ([...running].some((s) => s.isRunning())) void pauseAll();
}

function onExit(): void {
  for (const s of [...running]) if (s.isRunning()) s.captureOnExit();
}

/** A sandbox that runs in this process (created or connected). */
export function registerRunning(sbx: Pausable): void {
  running.add(sbx);
  if (!beforeExitInstalled) {
    beforeExitInstalled = true;
    process.on('beforeExit', onBeforeExit);
    process.on('exit', onExit);
  }
}

export function unregisterRunning(sbx: Pausable): void {
  running.delete(sbx);
}

/**
 * Pauses the running sandboxes on `signals` (default SIGINT and SIGTERM), then re-raises the
 * signal. Returns a function that removes the handlers. Pauses are bounded by `timeoutMs`
 * (default 30 s): a pause that has not finished by then is abandoned, and the sandbox is
 * recovered from its last generation by the next connect.
 */
export function installSignalHandlers(opts: { signals?: NodeJS.Signals[]; timeoutMs?: number } = {}): () => void {
  const signals = opts.signals ?? ['SIGINT', 'SIGTERM'];
  const bound = opts.timeoutMs ?? 30_000;
  const handlers = new Map<NodeJS.Signals, () => void>();
  const uninstall = () => {
    for (const [sig, h] of handlers) process.off(sig, h);
    handlers.clear();
  };
  for (const sig of signals) {
    let busy = false;
    const handler = () => {
      if (busy) return;
      busy = true;
      const timer = new Promise((r) => setTimeout(r, bound).unref());
      void Promise.race([pauseAll(), timer]).finally(() => {
        uninstall();
        process.kill(process.pid, sig);
      });
    };
    handlers.set(sig, handler);
    process.on(sig, handler);
  }
  return uninstall;
}
