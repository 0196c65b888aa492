// What a start has set up so far, to be undone in reverse order: the idea of the TC39
// AsyncDisposableStack (defer, disposeAsync, move), which Node 20 does not have at run time.
//
//   const undo = new UndoStack();
//   await mkdir(tmp);
//   undo.defer(() => rm(tmp, { recursive: true, force: true }));
//   const run = await GuestRun.boot(...);
//   undo.defer(() => run.stop());
//   ...                          // on failure: await undo.disposeAsync() stops the guest, then removes tmp
//   undo.move();                 // on success: nothing is undone; the steps now belong to the returned stack

type Step = () => unknown;

export class UndoStack {
  #steps: Step[] = [];

  /** Adds a step, undone before every step deferred earlier. */
  defer(step: Step): void {
    this.#steps.push(step);
  }

  /** Whether there is nothing to undo. */
  get empty(): boolean {
    return this.#steps.length === 0;
  }

  /**
   * Runs the steps, newest first, each once. Every step runs even when one before it failed
   * (an undo that gives up half-way would leave a machine or a backend behind); the first
   * failure is thrown once all have run.
   */
  async disposeAsync(): Promise<void> {
    const steps = this.#steps;
    this.#steps = [];
    let failed = false;
    let first: unknown;
    for (let i = steps.length - 1; i >= 0; i--) {
      try {
        await steps[i]!();
      } catch (err) {
        if (!failed) first = err;
        failed = true;
      }
    }
    if (failed) throw first;
  }

  /** Hands the steps to a new stack and leaves this one empty (what succeeded is kept). */
  move(): UndoStack {
    const next = new UndoStack();
    next.#steps = this.#steps;
    this.#steps = [];
    return next;
  }
}
