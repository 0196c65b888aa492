// A sandbox's lifecycle (docs/architecture.md#lifecycle): its states and the transitions between them, checked in
// this one place. Every state change of a Sandbox goes through Lifecycle.to(); an operation
// that needs a state asks Lifecycle.require() first.
//
//   starting -> running <-> pausing -> paused -> resuming -> running
//   any live state -> killed;  starting / pausing / resuming -> failed
import { TorporError } from '../errors.js';
import type { SandboxState } from '../store/sandbox-state.js';

export { SANDBOX_STATES, isSandboxState, type SandboxState } from '../store/sandbox-state.js';

/** The states each state may move to. */
const NEXT: Record<SandboxState, readonly SandboxState[]> = {
  starting: ['running', 'failed', 'killed'],
  // failed: the machine ended by itself (panic, reset).
  running: ['pausing', 'killed', 'failed'],
  // running: the capture failed before anything was stopped, the sandbox goes on.
  pausing: ['paused', 'running', 'failed', 'killed'],
  paused: ['resuming', 'killed'],
  // paused: the resume gave up with the sandbox's files untouched (its owner lock released).
  resuming: ['running', 'paused', 'failed', 'killed'],
  killed: [],
  failed: ['killed'],
};

/** INVALID_STATE: a state change or an operation the sandbox's state does not allow (pause of a paused sandbox, a command in a killed one, ...). */
export class IllegalTransitionError extends TorporError {
  /** The sandbox's state when it was refused. */
  readonly from: SandboxState;
  /** The state it was asked to move to; undefined when an operation was refused instead. */
  readonly to: SandboxState | undefined;

  constructor(message: string, from: SandboxState, to?: SandboxState) {
    super('INVALID_STATE', message);
    this.from = from;
    this.to = to;
  }
}

export function canMove(from: SandboxState, to: SandboxState): boolean {
  return NEXT[from].includes(to);
}

export class Lifecycle {
  #state: SandboxState;
  readonly #listeners = new Set<(to: SandboxState, from: SandboxState) => void>();

  constructor(
    initial: SandboxState,
    private readonly what: string,
  ) {
    this.#state = initial;
  }

  get state(): SandboxState {
    return this.#state;
  }

  /** Moves to `next`; throws IllegalTransitionError (INVALID_STATE) when the table above does not allow it. */
  to(next: SandboxState): void {
    const from = this.#state;
    if (!canMove(from, next)) {
      throw new IllegalTransitionError(`${this.what} cannot go from ${from} to ${next}`, from, next);
    }
    this.#state = next;
    for (const l of [...this.#listeners]) l(next, from);
  }

  /** Throws INVALID_STATE unless the state is one of `states`, naming `operation` and what to do. */
  require(operation: string, ...states: SandboxState[]): void {
    if (states.includes(this.#state)) return;
    const hint =
      this.#state === 'paused'
        ? ' Call sbx.resume() or Sandbox.connect(sandboxId) to continue it.'
        : this.#state === 'killed'
          ? ' It was killed; create a new sandbox.'
          : '';
    throw new IllegalTransitionError(`${operation} needs ${this.what} to be ${states.join(' or ')}; it is ${this.#state}.${hint}`, this.#state);
  }

  onChange(listener: (to: SandboxState, from: SandboxState) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
}
