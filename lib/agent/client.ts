// AgentClient: one session with a torpor agent over any Duplex byte stream (a Unix socket to the
// agent on the host, or a vsock socket into a VM). Multiplexes requests as streams, keeps request
// ids, and, when given a way to dial again, survives a transport reset by re-asking what was in
// flight (the agent remembers request ids, so nothing runs twice).
import type { Duplex } from 'node:stream';

import { TorporError, abortError } from '../errors.js';
import { Connection, type AgentHello } from './connection.js';
import type { Fields, FieldWriter } from './fields.js';
import type { Frame } from './frame.js';
import { Feature } from './protocol.js';
import { RequestStream, requestName, type StreamHandler, type StreamHost } from './stream.js';
import { randomBytes } from '../random.js';

/** Opens a new transport to the agent (a vsock or Unix socket); a client that reconnects calls it again. */
export type Dial = () => Promise<Duplex>;

export interface RequestOptions {
  /** Frame flags of the request frame (END: e.g. STDIN that closes stdin). */
  flags?: number;
  /** Ask under this request id instead of a fresh one (re-asking a request from another session). */
  requestId?: bigint;
}

/** How {@link AgentClient.connect} sets up a session. */
export interface AgentClientOptions {
  /** Sent in HELLO. */
  name?: string;
  /** How long to wait for the agent's HELLO (default 10 s). */
  helloTimeoutMs?: number;
  /** Dial again after an unexpected close and re-ask in-flight requests (needs a Dial). */
  reconnect?:
    | boolean
    | {
        /** How many dials to try before giving up (the client is closed then). */
        attempts?: number;
        /** The wait between two dials, ms. */
        delayMs?: number;
      };
}

/** What the owner of a client watches of its requests (a Sandbox: its state, its idle timer). */
export interface RequestHooks {
  /** Before a request is opened; what it throws refuses the request. */
  beforeOpen?(): void;
  /** A request was opened, or one of its answer frames came. */
  onActivity?(): void;
}

const CLIENT_NAME = 'torpor-js/0.1.0';
/** How long a re-asked request whose work is still running waits before asking again. */
const PENDING_RETRY_MS = 20;

/**
 * A session with a torpor guest agent over one transport (docs/protocol.md): HELLO, then
 * requests multiplexed as streams. A Sandbox holds one; {@link connectHostAgent} makes one to an
 * agent run on the host (tests, benchmarks). Requests fail with the agent's error codes;
 * CONNECTION_CLOSED once the client is closed.
 */
export class AgentClient {
  private conn: Connection | null = null;
  private readonly streams = new Map<number, RequestStream>();
  private readonly live = new Set<RequestStream>();
  private nextStreamId = 1;
  private readonly requestHigh = BigInt(randomBytes(4).readUInt32LE()) << 32n;
  private requestCounter = 0n;
  private closedByUser = false;
  /** What close() was told ended the session: later requests fail saying it too. */
  private closedWhy: string | undefined;
  private reconnecting: Promise<void> | null = null;
  private lastError: TorporError | undefined;
  private helloInfo!: AgentHello;
  /** connectExpecting's HELLO not answered yet: a close then fails the session, no redial. */
  private helloPending = false;
  private readonly closeListeners = new Set<(err: TorporError | undefined) => void>();
  /** Number of successful reconnects (tests and diagnostics). */
  reconnects = 0;
  private idleUnref = false;
  private hooks: RequestHooks = {};

  private constructor(
    private readonly dial: Dial | null,
    private readonly opts: AgentClientOptions,
  ) {}

  /** Connects over `transport` (or a function that opens one) and performs HELLO. */
  static async connect(transport: Duplex | Dial, opts: AgentClientOptions = {}): Promise<AgentClient> {
    const dial = typeof transport === 'function' ? transport : null;
    const client = new AgentClient(dial, opts);
    client.conn = await client.attach(typeof transport === 'function' ? await transport() : transport);
    return client;
  }

  /**
   * connect() to an agent whose HELLO is known beforehand (`expected`: a fork's child runs its
   * parent's agent, the one whose HELLO the parent's client has): HELLO is written and the
   * client takes requests at once: those made in the same turn of the event loop (RESUMED) go
   * out in one write with it, and the guest answers them in one wake-up, not a round trip
   * apart. `hello` settles with the agent's answer. An answer of another version, or without
   * every feature `expected` names, ends the connection before anything behind it is taken:
   * `hello` and the requests made meanwhile reject with PROTOCOL_ERROR. Until it settles the
   * client does not reconnect.
   */
  static async connectExpecting(
    transport: Duplex | Dial,
    expected: AgentHello,
    opts: AgentClientOptions = {},
  ): Promise<{ client: AgentClient; hello: Promise<AgentHello> }> {
    const dial = typeof transport === 'function' ? transport : null;
    const client = new AgentClient(dial, opts);
    const socket = typeof transport === 'function' ? await transport() : transport;
    // HELLO and what is asked in this turn of the event loop leave in one write: the peer
    // (the VMM's vsock device) reads them at once and the guest gets them in one packet.
    socket.cork();
    setImmediate(() => socket.uncork());
    client.helloPending = true;
    const { connection, hello } = client.begin(socket, expected);
    client.conn = connection;
    client.helloInfo = { ...expected };
    const answered = hello.then(
      (got) => {
        client.helloPending = false;
        client.helloInfo = { ...got, features: expected.features };
        return client.helloInfo;
      },
      (err: unknown) => {
        client.helloPending = false;
        client.connectionClosed(connection, err instanceof TorporError ? err : undefined, false);
        throw err;
      },
    );
    answered.catch(() => undefined);
    return { client, hello: answered };
  }

  /** What the agent announced in HELLO: protocol version, features, name, clock. */
  get hello(): AgentHello {
    return this.helloInfo;
  }

  /** Whether both sides announced a feature. */
  supports(feature: keyof typeof Feature): boolean {
    return (this.helloInfo.features & Feature[feature]) !== 0n;
  }

  /** Throws when the agent did not announce `feature` (the client uses only what both sides do). */
  requireFeature(feature: keyof typeof Feature): void {
    if (!this.supports(feature)) {
      throw new TorporError('REQUEST_FAILED', `the agent (${this.helloInfo.name || 'unnamed'}) does not offer ${feature}; it announced features 0x${this.helloInfo.features.toString(16)}`);
    }
  }

  /** Whether the client is closed for good (closed by the caller, or its transport gone and no reconnect under way). */
  get closed(): boolean {
    return this.closedByUser || (this.conn === null && this.reconnecting === null);
  }

  /** Registers a listener called once when the client is closed for good. */
  onClose(listener: (err: TorporError | undefined) => void): () => void {
    this.closeListeners.add(listener);
    return () => this.closeListeners.delete(listener);
  }

  /**
   * With `on`, the transport keeps the process alive only while a request is in flight: an idle
   * session lets Node reach `beforeExit` (a Sandbox pauses there). Off by default.
   */
  setIdleUnref(on: boolean): void {
    this.idleUnref = on;
    this.updateRef();
  }

  /** Calls `hooks` around every request from now on (replacing earlier ones). @internal what a Sandbox needs of its client (activity, refusing calls while paused) */
  setRequestHooks(hooks: RequestHooks): void {
    this.hooks = hooks;
  }

  private updateRef(): void {
    this.conn?.setRef(!this.idleUnref || this.live.size > 0);
  }

  /** PING round trip in milliseconds (fractional). */
  async ping(timeoutMs = 5000): Promise<number> {
    const conn = await this.connection_();
    const ns = await conn.ping(timeoutMs);
    return Number(ns) / 1e6;
  }

  /** Opens a request stream; the handler sees every answer frame. @internal the protocol's own level (docs/protocol.md) */
  open(type: number, fields: FieldWriter, handler: StreamHandler, opts: RequestOptions = {}): RequestStream {
    const { beforeOpen, onActivity } = this.hooks;
    beforeOpen?.();
    if (onActivity) {
      onActivity();
      handler = withActivity(handler, onActivity);
    }
    if (this.closedByUser) throw new TorporError('CONNECTION_CLOSED', this.closedWhy ?? 'the agent client is closed');
    if (this.conn === null && this.reconnecting === null) {
      throw this.lastError ?? new TorporError('CONNECTION_CLOSED', 'the agent connection is closed');
    }
    const stream = new RequestStream(this.host, type, fields, handler, opts.flags ?? 0, opts.requestId);
    this.live.add(stream);
    this.updateRef();
    stream.issue();
    return stream;
  }

  /** A request with one answer (OK, or ERR thrown as a TorporError). A re-asked request whose
   *  work is still running (`pending`) is asked again until it has an answer.
   *  @internal the protocol's own level (docs/protocol.md) */
  call(type: number, fields: FieldWriter, opts: RequestOptions & { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<Fields> {
    const { signal } = opts;
    if (signal?.aborted) return Promise.reject(abortError(signal, requestName(type)));
    return new Promise<Fields>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      let onAbort: (() => void) | undefined;
      const settle = (fn: () => void) => {
        if (timer) clearTimeout(timer);
        if (onAbort) signal?.removeEventListener('abort', onAbort);
        fn();
      };
      const stream = this.open(
        type,
        fields,
        {
          onFrame: (_type, _flags, answer, s) => {
            if (answer.bool('pending')) {
              setTimeout(() => s.askAgain(), PENDING_RETRY_MS);
              return;
            }
            if (!s.done) s.cancel();
            settle(() => resolve(answer));
          },
          onError: (err) => settle(() => reject(err)),
          reissue: () => ({ type, fields, sameRequestId: true }),
        },
        opts,
      );
      if (opts.timeoutMs) {
        timer = setTimeout(() => {
          stream.cancel();
          settle(() => reject(new TorporError('TIMEOUT', `${requestName(type)} got no answer within ${opts.timeoutMs} ms`)));
        }, opts.timeoutMs);
      }
      if (signal) {
        // The request is cancelled; what the agent already did stays done (a request is one
        // step: a mkdir made, a file renamed), which is what the caller then sees by asking.
        onAbort = () => {
          if (!stream.done) stream.cancel();
          settle(() => reject(abortError(signal, requestName(type))));
        };
        signal.addEventListener('abort', onAbort, { once: true });
      }
    });
  }

  /** Drops the current transport and dials again, re-asking every in-flight request. */
  async reconnect(): Promise<void> {
    if (!this.dial) throw new TorporError('INVALID_STATE', 'this agent client was given a socket, not a way to dial again');
    const old = this.conn;
    this.conn = null;
    old?.close();
    await this.startReconnect();
  }

  /** Writes raw bytes on the transport (tests: hostile frames). */
  sendRaw(bytes: Buffer): void {
    this.conn?.sendRaw(bytes);
  }

  /**
   * Closes the session: in-flight requests fail with CONNECTION_CLOSED (with `why` as their
   * message when given: what ended the session); processes keep running.
   */
  async close(why?: string): Promise<void> {
    if (this.closedByUser) return;
    this.closedByUser = true;
    this.closedWhy = why;
    const conn = this.conn;
    this.conn = null;
    conn?.close();
    this.failAll(new TorporError('CONNECTION_CLOSED', why ?? 'the agent client was closed'));
    this.emitClose(undefined);
  }

  // ---- internals ----

  private readonly host: StreamHost = {
    connection: () => (this.conn && !this.conn.isClosed ? this.conn : null),
    register: (stream) => {
      const id = this.nextStreamId;
      this.nextStreamId += 2;
      if (this.nextStreamId > 0xffffffff) this.nextStreamId = 1; // practically unreachable
      this.streams.set(id, stream);
      return id;
    },
    unregister: (stream) => {
      if (this.streams.get(stream.id) === stream) this.streams.delete(stream.id);
      if (stream.done) {
        this.live.delete(stream);
        this.updateRef();
      }
    },
    revive: (stream) => {
      this.live.add(stream);
      this.updateRef();
    },
    usable: () => !this.closedByUser && (this.conn !== null || this.reconnecting !== null),
    newRequestId: () => {
      this.requestCounter = (this.requestCounter + 1n) & 0xffffffffn;
      return this.requestHigh | this.requestCounter;
    },
  };

  private async connection_(): Promise<Connection> {
    if (this.closedByUser) throw new TorporError('CONNECTION_CLOSED', this.closedWhy ?? 'the agent client is closed');
    if (this.reconnecting) await this.reconnecting;
    if (this.conn && !this.conn.isClosed) return this.conn;
    throw this.lastError ?? new TorporError('CONNECTION_CLOSED', 'the agent connection is closed');
  }

  /** Opens a Connection and performs HELLO; the caller installs it as `this.conn`. */
  private async attach(socket: Duplex): Promise<Connection> {
    const { connection, hello: answer } = this.begin(socket);
    const hello = await answer;
    if (connection.isClosed) throw this.lastError ?? new TorporError('CONNECTION_CLOSED', 'the agent closed the connection');
    if (this.helloInfo) {
      // The agent may have changed under us (a restored VM): keep only what both had.
      hello.features &= this.helloInfo.features;
    }
    this.helloInfo = hello;
    return connection;
  }

  /** A Connection on `socket` routing its frames and close to this client, its HELLO written
   *  (Connection.begin). A close before it is installed as `conn` is not this client's (the
   *  handshake's rejection reports it). */
  private begin(socket: Duplex, expect?: AgentHello): { connection: Connection; hello: Promise<AgentHello> } {
    let ref: Connection | null = null;
    const begun = Connection.begin(
      socket,
      {
        onFrame: (frame) => this.route(frame),
        onClose: (err, byGoaway) => this.connectionClosed(ref, err, byGoaway),
      },
      { name: this.opts.name ?? CLIENT_NAME, timeoutMs: this.opts.helloTimeoutMs ?? 10_000, ...(expect ? { expect } : {}) },
    );
    ref = begun.connection;
    return begun;
  }

  private route(frame: Frame): void {
    const stream = this.streams.get(frame.stream);
    // Frames for a stream we cancelled or finished are dropped: they were in flight.
    if (stream) stream.receive(frame.type, frame.flags, frame.payload);
  }

  private connectionClosed(which: Connection | null, err: TorporError | undefined, byGoaway: boolean): void {
    if (which === null || which !== this.conn) return; // a handshake failure, or a connection we replaced
    this.conn = null;
    if (this.closedByUser) return;
    this.lastError = err;
    const policy = this.opts.reconnect;
    const mayReconnect = this.dial !== null && policy && !byGoaway && err?.code !== 'PROTOCOL_ERROR' && !this.helloPending;
    if (mayReconnect) {
      void this.startReconnect().catch(() => undefined);
      return;
    }
    this.failAll(err ?? new TorporError('CONNECTION_CLOSED', 'the agent connection was closed'));
    this.emitClose(err);
  }

  private startReconnect(): Promise<void> {
    if (this.reconnecting) return this.reconnecting;
    const policy = typeof this.opts.reconnect === 'object' ? this.opts.reconnect : {};
    const attempts = policy.attempts ?? 50;
    const delayMs = policy.delayMs ?? 20;
    this.reconnecting = (async () => {
      let lastErr: unknown;
      for (let i = 0; i < attempts && !this.closedByUser; i++) {
        try {
          const conn = await this.attach(await this.dial!());
          if (this.closedByUser) {
            conn.close();
            return;
          }
          this.conn = conn;
          this.reconnects++;
          this.reissueAll();
          this.updateRef();
          return;
        } catch (err) {
          lastErr = err;
          await new Promise((r) => setTimeout(r, delayMs * Math.min(1 + i, 10)));
        }
      }
      const err = new TorporError(
        'CONNECTION_CLOSED',
        `could not reconnect to the agent after ${attempts} attempts: ${lastErr instanceof Error ? lastErr.message : String(lastErr)}`,
        { cause: lastErr },
      );
      this.lastError = err;
      this.failAll(err);
      this.emitClose(err);
      throw err;
    })().finally(() => {
      this.reconnecting = null;
    });
    return this.reconnecting;
  }

  private reissueAll(): void {
    this.streams.clear();
    for (const stream of [...this.live]) {
      if (stream.done) {
        this.live.delete(stream);
        continue;
      }
      if (!stream.reissue()) {
        stream.fail(new TorporError('CONNECTION_CLOSED', `the agent connection was reset during ${requestName(stream.type)}`));
      }
    }
  }

  private failAll(err: TorporError): void {
    this.streams.clear();
    const all = [...this.live];
    this.live.clear();
    this.updateRef();
    for (const stream of all) stream.fail(err);
  }

  private emitClose(err: TorporError | undefined): void {
    const listeners = [...this.closeListeners];
    this.closeListeners.clear();
    for (const l of listeners) l(err);
  }
}

/** `handler`, telling `onActivity` of each answer frame first. */
function withActivity(handler: StreamHandler, onActivity: () => void): StreamHandler {
  return {
    onFrame: (...a) => {
      onActivity();
      handler.onFrame(...a);
    },
    onError: (err) => handler.onError(err),
    ...(handler.reissue ? { reissue: () => handler.reissue!() } : {}),
  };
}
