// A sandbox's lifecycle timeout: fires `timeoutMs` after the last activity. Activity (documented
// in docs/sandbox-lifecycle.md) is every request an API call sends to the agent and every frame
// the agent sends back (a command producing output, a file streaming), and a call that waits for
// the guest (`busy`: a foreground command that prints nothing for longer than timeoutMs is not
// idleness; its caller waits on it). touch() only records the time: one timer per sandbox,
// re-armed for the remainder when it fires early.
export class IdleTimer {
  #last = Date.now();
  #timer: NodeJS.Timeout | undefined;
  #stopped = true;

  constructor(
    private readonly timeoutMs: number,
    private readonly onIdle: () => void,
    private readonly busy: () => boolean = () => false,
  ) {}

  start(): void {
    this.#stopped = false;
    this.#last = Date.now();
    this.#arm(this.timeoutMs);
  }

  touch(): void {
    this.#last = Date.now();
  }

  /** When it fires if nothing happens before (null once stopped); while busy, timeoutMs from now
   *  at the earliest (the time of the last activity says nothing while a call waits). */
  get deadline(): Date | null {
    if (this.#stopped) return null;
    return new Date((this.busy() ? Date.now() : this.#last) + this.timeoutMs);
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #arm(ms: number): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#fire(), Math.max(1, ms));
    // A timeout never keeps the process alive (beforeExit pauses running sandboxes anyway).
    this.#timer.unref();
  }

  #fire(): void {
    this.#timer = undefined;
    if (this.#stopped) return;
    if (this.busy()) this.#last = Date.now();
    const left = this.#last + this.timeoutMs - Date.now();
    if (left > 0) return this.#arm(left);
    this.#stopped = true;
    this.onIdle();
  }
}
