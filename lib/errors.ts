// Every failure torpor reports is a TorporError with a stable `code`.
// The native addon creates its errors through createError() (handed to it at
// load time), so errors thrown in C++ arrive as these same classes.

/**
 * The stable code every {@link TorporError} carries in `code`: branch on it, not on the message.
 * The first group has a subclass each (KVM_UNAVAILABLE: {@link KvmUnavailableError}, and so on);
 * IMAGE_* , REGISTRY_* and BLOB_CORRUPT name a container image, its registry or a blob; the rest
 * come from the native core, the guest agent (file and process errors: PERMISSION_DENIED,
 * FILE_EXISTS, NOT_A_DIRECTORY, ...) and the setup tooling, and arrive as a plain TorporError.
 */
export type ErrorCode =
  | 'KVM_UNAVAILABLE'
  | 'TEMPLATE_NOT_FOUND'
  | 'SANDBOX_NOT_FOUND'
  | 'SANDBOX_BUSY'
  | 'INVALID_ARGUMENT'
  | 'COMMAND_EXIT'
  | 'TIMEOUT'
  | 'ABORTED'
  | 'FILE_NOT_FOUND'
  | 'SNAPSHOT_INVALID'
  | 'SNAPSHOT_INCOMPATIBLE'
  | 'GUEST_UNRESPONSIVE'
  | 'OUT_OF_SPACE'
  | 'OUTPUT_LOST'
  | 'OUTPUT_LIMIT'
  | 'TEMPLATE_CHANGED'
  | 'TEMPLATE_IN_USE'
  | 'TEMPLATE_BUILD_FAILED'
  // Container images (lib/image): each names the image, the registry or the blob.
  | 'IMAGE_NOT_FOUND'
  | 'IMAGE_PLATFORM'
  | 'IMAGE_INVALID'
  | 'REGISTRY_AUTH'
  | 'REGISTRY_UNREACHABLE'
  | 'BLOB_CORRUPT'
  // Lower-level codes from the native core and the setup tooling.
  | 'IO_ERROR'
  | 'GUEST_MEMORY'
  | 'BOOT_FAILED'
  | 'MACHINE_FAILED'
  | 'INVALID_STATE'
  | 'VSOCK_REFUSED'
  | 'NET_BACKEND'
  | 'PROTOCOL_ERROR'
  | 'CONNECTION_CLOSED'
  | 'PERMISSION_DENIED'
  | 'FILE_EXISTS'
  | 'NOT_A_DIRECTORY'
  | 'IS_A_DIRECTORY'
  | 'NOT_EMPTY'
  | 'REQUEST_FAILED'
  | 'PROCESS_NOT_FOUND'
  | 'SETUP_FAILED'
  | 'MISSING_TOOLS'
  | 'KERNEL_INVALID'
  | 'KERNEL_PACKAGE_MISMATCH'
  | 'ARTIFACT_CORRUPT'
  | 'ADDON_LOAD_FAILED'
  | 'INTERNAL';

/** What a {@link TorporError} may carry besides its code and message. */
export interface TorporErrorOptions {
  /** The OS error number behind the failure (a host syscall's, or the guest's for a file or process request). */
  errno?: number;
  /** The underlying error, kept as the standard `Error.cause`. */
  cause?: unknown;
}

/** E2B's name for the base class of its errors: code written against E2B's `SandboxError` catches torpor's. */
export { TorporError as SandboxError };

/**
 * The base of every error torpor throws: `instanceof TorporError` catches them all, and `code`
 * ({@link ErrorCode}) says what failed. `name` is the subclass's name.
 */
export class TorporError extends Error {
  /** What failed, stable across releases. */
  readonly code: ErrorCode;
  /** The OS error number behind it, when there is one. */
  readonly errno?: number;

  constructor(code: ErrorCode, message: string, options: TorporErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    if (options.errno !== undefined) this.errno = options.errno;
  }
}

/** KVM_UNAVAILABLE: /dev/kvm is missing, not accessible to this user, or lacks a capability torpor needs (the message says which). */
export class KvmUnavailableError extends TorporError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('KVM_UNAVAILABLE', message, options);
  }
}
/** INVALID_ARGUMENT: an option or argument was refused before anything ran (the message names it and what is allowed). */
export class InvalidArgumentError extends TorporError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('INVALID_ARGUMENT', message, options);
  }
}
/** TIMEOUT: an operation ran past its deadline (a command's `timeoutMs`, a request's `requestTimeoutMs`, a boot or restore). */
export class TimeoutError extends TorporError {
  /** What a command printed before its timeoutMs killed it (unset for other timeouts). */
  readonly stdout?: string | Buffer;
  /** What a command wrote to stderr before its timeoutMs killed it (unset for other timeouts). */
  readonly stderr?: string | Buffer;

  constructor(message: string, options: TorporErrorOptions & { stdout?: string | Buffer; stderr?: string | Buffer } = {}) {
    super('TIMEOUT', message, options);
    if (options.stdout !== undefined) this.stdout = options.stdout;
    if (options.stderr !== undefined) this.stderr = options.stderr;
  }
}
/** ABORTED: the caller's AbortSignal (`signal` option) aborted the call. `name` is 'AbortError',
 *  as the DOM's and Node's are, so code that checks `err.name === 'AbortError'` works; `cause` is
 *  the signal's reason. What the call started is undone or finished first: nothing is left
 *  half-done (docs/sandbox-lifecycle.md#cancellation). */
export class AbortError extends TorporError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('ABORTED', message, options);
  }
}
/** The AbortError for `signal` aborting `what` (the signal's reason as its cause). @internal */
export function abortError(signal: AbortSignal, what: string): AbortError {
  return new AbortError(`${what}: aborted by the caller's signal`, { cause: signal.reason });
}
/** FILE_NOT_FOUND, SANDBOX_NOT_FOUND or TEMPLATE_NOT_FOUND: something named does not exist: a file, a sandbox or a template (E2B's `NotFoundError`;
 *  `code` says which). */
export class NotFoundError extends TorporError {}
/** FILE_NOT_FOUND: a path in the guest (or a host file torpor was given) does not exist. */
export class FileNotFoundError extends NotFoundError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('FILE_NOT_FOUND', message, options);
  }
}
/** SANDBOX_NOT_FOUND: no sandbox with that id on this host (never created, or killed). */
export class SandboxNotFoundError extends NotFoundError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('SANDBOX_NOT_FOUND', message, options);
  }
}
/** TEMPLATE_NOT_FOUND: no template of that name (built-in or built with {@link Template.build}). */
export class TemplateNotFoundError extends NotFoundError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('TEMPLATE_NOT_FOUND', message, options);
  }
}
/** SANDBOX_BUSY: another live process runs the sandbox (`ownerPid`, when known): pause it there, or end that process. */
export class SandboxBusyError extends TorporError {
  /** The process that runs the sandbox, or null when it is not known. */
  readonly ownerPid: number | null;
  constructor(message: string, options: TorporErrorOptions & { ownerPid?: number | null } = {}) {
    super('SANDBOX_BUSY', message, options);
    this.ownerPid = options.ownerPid ?? null;
  }
}
/** OUTPUT_LOST: a command's output asked for from an offset older than the oldest byte the guest still keeps. */
export class OutputLostError extends TorporError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('OUTPUT_LOST', message, options);
  }
}
/** GUEST_UNRESPONSIVE: the guest agent did not answer in time (after a boot, a restore or a reconnect). */
export class GuestUnresponsiveError extends TorporError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('GUEST_UNRESPONSIVE', message, options);
  }
}
/** OUT_OF_SPACE: a disk is full: the guest's filesystem, or the host's where torpor writes a snapshot or an image. */
export class NotEnoughSpaceError extends TorporError {
  constructor(message: string, options?: TorporErrorOptions) {
    super('OUT_OF_SPACE', message, options);
  }
}

/** COMMAND_EXIT: a command exited with a non-zero status (thrown unless the caller passed `throwOnError: false`). */
export class CommandExitError<O extends string | Buffer = string> extends TorporError {
  /** The exit status; 128 + the signal number when a signal ended it. */
  readonly exitCode: number;
  /** Everything the command wrote to stdout (a Buffer when it ran with `encoding: 'buffer'`). */
  readonly stdout: O;
  /** Everything the command wrote to stderr (as stdout). */
  readonly stderr: O;
  /** The signal that ended it ('SIGKILL', ...), when one did. */
  readonly signal?: string;
  /** E2B's words for the failure: 'exit status 3', or 'signal: killed' for a signal death (where
   *  exitCode is 128 + the signal number, as a shell reports it; E2B says -1). */
  readonly error: string;

  constructor(result: { exitCode: number; stdout: O; stderr: O; signal?: string; error?: string }, cmd?: string) {
    const what = cmd === undefined ? 'command' : `command ${JSON.stringify(cmd.length > 80 ? cmd.slice(0, 77) + '...' : cmd)}`;
    const how = result.signal ? `was killed by ${result.signal}` : `exited with code ${result.exitCode}`;
    // The message quotes stderr's last lines as text; bytes are decoded for it, lossily.
    const stderrText = typeof result.stderr === 'string' ? result.stderr : result.stderr.subarray(-4096).toString('utf8');
    const tail = stderrText.trim().split('\n').slice(-3).join('\n');
    super('COMMAND_EXIT', `${what} ${how}${tail ? `: ${tail}` : ''}`);
    this.exitCode = result.exitCode;
    this.stdout = result.stdout;
    this.stderr = result.stderr;
    if (result.signal !== undefined) this.signal = result.signal;
    this.error = result.error ?? `exit status ${result.exitCode}`;
  }
}

/** OUTPUT_LIMIT: a command's stdout or stderr outgrew `maxBuffer`: the process was killed and the output kept
 *  up to the limit is attached (`stdout`, `stderr`), as CommandExitError carries it. */
export class OutputLimitError<O extends string | Buffer = string> extends TorporError {
  /** The stdout kept, up to the limit (a Buffer when the command ran with `encoding: 'buffer'`). */
  readonly stdout: O;
  /** The stderr kept, up to the limit (as stdout). */
  readonly stderr: O;
  /** The stream that outgrew the limit (unset when built from a bare code). */
  readonly stream?: 'stdout' | 'stderr';
  /** The limit, in bytes, that was outgrown. */
  readonly maxBuffer?: number;

  constructor(
    message: string,
    options: TorporErrorOptions & { stdout?: O; stderr?: O; stream?: 'stdout' | 'stderr'; maxBuffer?: number } = {},
  ) {
    super('OUTPUT_LIMIT', message, options);
    this.stdout = options.stdout ?? ('' as O);
    this.stderr = options.stderr ?? ('' as O);
    if (options.stream !== undefined) this.stream = options.stream;
    if (options.maxBuffer !== undefined) this.maxBuffer = options.maxBuffer;
  }
}

const byCode: Partial<Record<ErrorCode, new (message: string, options?: TorporErrorOptions) => TorporError>> = {
  KVM_UNAVAILABLE: KvmUnavailableError,
  INVALID_ARGUMENT: InvalidArgumentError,
  TIMEOUT: TimeoutError,
  ABORTED: AbortError,
  FILE_NOT_FOUND: FileNotFoundError,
  SANDBOX_NOT_FOUND: SandboxNotFoundError,
  SANDBOX_BUSY: SandboxBusyError,
  TEMPLATE_NOT_FOUND: TemplateNotFoundError,
  OUTPUT_LOST: OutputLostError,
  OUTPUT_LIMIT: OutputLimitError,
  GUEST_UNRESPONSIVE: GuestUnresponsiveError,
  OUT_OF_SPACE: NotEnoughSpaceError,
};

/** Builds the most specific TorporError subclass for a code. */
export function createError(code: string, message: string, errno?: number): TorporError {
  const options: TorporErrorOptions = errno ? { errno } : {};
  const Ctor = byCode[code as ErrorCode];
  if (Ctor) return new Ctor(message, options);
  return new TorporError(code as ErrorCode, message, options);
}
