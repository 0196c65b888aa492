// One transport (a Duplex byte stream: a Unix socket or a vsock socket) carrying frames.
// It owns the decoder, the socket's write-side backpressure and the HELLO handshake; streams and
// request bookkeeping live in AgentClient, which may replace a Connection after a reconnect.
import type { Duplex } from 'node:stream';

import { TorporError, createError } from '../errors.js';
import { Fields, FieldWriter, ProtocolError } from './fields.js';
import { encodeFrame, FrameDecoder, type Frame } from './frame.js';
import { CLIENT_FEATURES, FLAG_END, FrameType, PROTOCOL_VERSION } from './protocol.js';
import { randomBytes } from '../random.js';

/** What an agent announces in HELLO. */
export interface AgentHello {
  /** The protocol version the agent speaks. */
  version: number;
  /** Features both sides announced. */
  features: bigint;
  /** The agent's software name and version. */
  name: string;
  /** The agent's wall clock at HELLO, ns since the epoch (0n when not sent). */
  timeNs: bigint;
}

export interface ConnectionEvents {
  /** A frame on a request stream (stream != 0). */
  onFrame(frame: Frame): void;
  /** The connection ended; `error` says why (undefined for a local close). */
  onClose(error: TorporError | undefined, byGoaway: boolean): void;
}

export class Connection {
  private readonly decoder = new FrameDecoder();
  private readonly pings = new Map<string, { done: () => void; fail: (err: TorporError) => void }>();
  private closed = false;
  private readonly pingPrefix = randomBytes(4).readUInt32LE(0);
  private pingCounter = 0;
  private drainWaiters: Array<() => void> = [];
  private helloResolve: ((fields: Fields) => void) | null = null;
  private helloReject: ((err: TorporError) => void) | null = null;
  /** What begin() was told the HELLO answer must offer. */
  private expectHello: { version: number; features: bigint } | null = null;
  /** onClose was called (exactly once per connection). */
  private reported = false;

  private constructor(
    private readonly socket: Duplex,
    private readonly events: ConnectionEvents,
  ) {
    socket.on('data', (chunk: Buffer) => this.receive(chunk));
    socket.on('drain', () => this.releaseDrainWaiters());
    socket.on('error', (err) =>
      this.shutdown(new TorporError('CONNECTION_CLOSED', `agent connection failed: ${err.message}`, { cause: err }), false),
    );
    socket.on('close', () => this.shutdown(new TorporError('CONNECTION_CLOSED', 'the agent closed the connection'), false));
    socket.on('end', () => this.shutdown(new TorporError('CONNECTION_CLOSED', 'the agent closed the connection'), false));
  }

  /** Wraps a transport and performs HELLO. Rejects (and destroys the transport) on failure. */
  static async open(
    socket: Duplex,
    events: ConnectionEvents,
    opts: { name: string; timeoutMs: number },
  ): Promise<{ connection: Connection; hello: AgentHello }> {
    const { connection, hello } = Connection.begin(socket, events, opts);
    return { connection, hello: await hello };
  }

  /**
   * open() without waiting: HELLO is written now and `hello` settles with the agent's answer.
   * What the caller writes next goes out behind the HELLO (the agent reads a connection in
   * order and answers HELLO first); its answers arrive after HELLO's. With `expect`, an answer
   * of another version, or without one of those features, is a PROTOCOL_ERROR met before any
   * frame behind it is taken: nothing the caller asked meanwhile is answered by that agent.
   */
  static begin(
    socket: Duplex,
    events: ConnectionEvents,
    opts: { name: string; timeoutMs: number; expect?: { version: number; features: bigint } },
  ): { connection: Connection; hello: Promise<AgentHello> } {
    const connection = new Connection(socket, events);
    connection.expectHello = opts.expect ?? null;
    return { connection, hello: connection.handshake(opts.name, opts.timeoutMs) };
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Whether the socket keeps the process alive (net.Socket ref/unref; other Duplexes: no-op). */
  setRef(on: boolean): void {
    const s = this.socket as Duplex & { ref?: () => void; unref?: () => void };
    if (on) s.ref?.();
    else s.unref?.();
  }

  /** Writes one frame; returns false when the socket asks the writer to wait for drain. */
  send(stream: number, type: number, flags: number, payload?: Buffer): boolean {
    if (this.closed) return false;
    return this.socket.write(encodeFrame(stream, type, flags, payload));
  }

  /** Writes pre-encoded bytes (tests use it for hostile frames). */
  sendRaw(bytes: Buffer): void {
    if (!this.closed) this.socket.write(bytes);
  }

  /** Resolves when the socket's write buffer has drained (at once when it has). */
  drained(): Promise<void> {
    if (this.closed || !this.socket.writableNeedDrain) return Promise.resolve();
    return new Promise((resolve) => this.drainWaiters.push(resolve));
  }

  async ping(timeoutMs: number): Promise<bigint> {
    // Unique per connection is all a nonce needs: a random prefix and a counter.
    const nonce = Buffer.allocUnsafe(8);
    nonce.writeUInt32LE(this.pingPrefix, 0);
    nonce.writeUInt32LE(++this.pingCounter >>> 0, 4);
    const key = nonce.toString('hex');
    return new Promise<bigint>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pings.delete(key);
        reject(new TorporError('GUEST_UNRESPONSIVE', `the agent did not answer PING within ${timeoutMs} ms`));
      }, timeoutMs);
      const start = process.hrtime.bigint();
      this.pings.set(key, {
        done: () => {
          clearTimeout(timer);
          resolve(process.hrtime.bigint() - start);
        },
        fail: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      });
      if (this.closed) {
        clearTimeout(timer);
        this.pings.delete(key);
        reject(new TorporError('CONNECTION_CLOSED', 'the agent connection is closed'));
        return;
      }
      this.send(0, FrameType.PING, 0, new FieldWriter().bytes('nonce', nonce).toBuffer());
    });
  }

  /** Sends GOAWAY (when a code is given) and closes the transport. */
  close(goaway?: { code: string; message: string }): void {
    if (this.closed) return;
    if (goaway) {
      const fw = new FieldWriter().str('code', goaway.code).str('message', goaway.message.slice(0, 1024));
      this.socket.write(encodeFrame(0, FrameType.GOAWAY, FLAG_END, fw.toBuffer()));
    }
    this.shutdown(undefined, false);
  }

  private async handshake(name: string, timeoutMs: number): Promise<AgentHello> {
    const answer = new Promise<Fields>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new TorporError('GUEST_UNRESPONSIVE', `the agent did not answer HELLO within ${timeoutMs} ms`));
      }, timeoutMs);
      this.helloResolve = (fields) => {
        clearTimeout(timer);
        resolve(fields);
      };
      this.helloReject = (err) => {
        clearTimeout(timer);
        reject(err);
      };
    });
    const fw = new FieldWriter()
      .u32('version', PROTOCOL_VERSION)
      .u64('features', CLIENT_FEATURES)
      .str('name', name);
    this.send(0, FrameType.HELLO, 0, fw.toBuffer());
    let fields: Fields;
    try {
      fields = await answer;
    } catch (err) {
      this.shutdown(err as TorporError, false);
      throw err;
    }
    const version = fields.u32('version');
    if (version !== PROTOCOL_VERSION) {
      const err = new ProtocolError(`the agent speaks protocol version ${version ?? 'none'}; this client speaks ${PROTOCOL_VERSION}`);
      this.close({ code: 'PROTOCOL_ERROR', message: err.message });
      throw err;
    }
    return {
      version,
      features: (fields.u64('features') ?? 0n) & CLIENT_FEATURES,
      name: fields.str('name') ?? '',
      timeNs: fields.i64('time_ns') ?? 0n,
    };
  }
  private receive(chunk: Buffer): void {
    if (this.closed) return;
    let frames: Frame[];
    try {
      frames = this.decoder.push(chunk);
    } catch (err) {
      this.protocolFailure(err as TorporError);
      return;
    }
    for (const frame of frames) {
      if (this.closed) return;
      try {
        if (frame.stream === 0) this.control(frame);
        else if (this.helloResolve) throw new ProtocolError('the agent sent a stream frame before its HELLO');
        else this.events.onFrame(frame);
      } catch (err) {
        if (err instanceof TorporError && err.code === 'PROTOCOL_ERROR') {
          this.protocolFailure(err);
          return;
        }
        // Anything else thrown while handling a frame is our bug or a callback's; it must not
        // escape into the socket's event handler (that would crash the host process): end this
        // connection and report the error to every request on it.
        const message = err instanceof Error ? err.message : String(err);
        this.close({ code: 'REQUEST_FAILED', message: 'client error' });
        this.reportClose(new TorporError('INTERNAL', `handling a frame from the agent failed: ${message}`, { cause: err }), false);
        return;
      }
    }
  }

  private control(frame: Frame): void {
    const fields = Fields.parse(frame.payload);
    switch (frame.type) {
      case FrameType.HELLO: {
        const resolve = this.helloResolve;
        if (!resolve) throw new ProtocolError('unexpected second HELLO from the agent');
        const reject = this.helloReject;
        this.helloResolve = null;
        this.helloReject = null;
        const want = this.expectHello;
        if (want) {
          const version = fields.u32('version');
          const missing = want.features & ~(fields.u64('features') ?? 0n);
          if (version !== want.version || missing !== 0n) {
            const err = new ProtocolError(
              `the agent (${fields.str('name') || 'unnamed'}) is not the one expected: version ${version ?? 'none'} (expected ${want.version}), lacking features 0x${missing.toString(16)}`,
            );
            reject?.(err);
            throw err; // receive() closes the connection before the frames behind it
          }
        }
        resolve(fields);
        return;
      }
      case FrameType.PING: {
        const nonce = fields.bytes('nonce') ?? Buffer.alloc(0);
        this.send(0, FrameType.PONG, 0, new FieldWriter().bytes('nonce', nonce).toBuffer());
        return;
      }
      case FrameType.PONG: {
        const key = (fields.bytes('nonce') ?? Buffer.alloc(0)).toString('hex');
        const waiter = this.pings.get(key);
        if (waiter) {
          this.pings.delete(key);
          waiter.done();
        }
        return;
      }
      case FrameType.GOAWAY: {
        const code = fields.str('code') ?? 'CONNECTION_CLOSED';
        const message = fields.str('message') ?? 'no reason given';
        const known = code === 'PROTOCOL_ERROR' ? code : 'CONNECTION_CLOSED';
        this.shutdown(createError(known, `the agent closed the connection (GOAWAY ${code}): ${message}`), true);
        return;
      }
      default:
        // CREDIT on stream 0 and frame types from a newer agent: nothing to do.
        return;
    }
  }

  private protocolFailure(err: TorporError): void {
    this.close({ code: 'PROTOCOL_ERROR', message: err.message });
    // close() reported no error; report the protocol violation itself.
    this.reportClose(err, false);
  }

  private reportClose(err: TorporError | undefined, byGoaway: boolean): void {
    if (this.reported) return;
    this.reported = true;
    this.events.onClose(err, byGoaway);
  }

  private shutdown(err: TorporError | undefined, byGoaway: boolean): void {
    if (!this.closed) {
      this.closed = true;
      this.socket.end();
      this.socket.destroy();
      const failure = err ?? new TorporError('CONNECTION_CLOSED', 'the agent connection was closed');
      this.helloReject?.(failure);
      this.helloResolve = null;
      this.helloReject = null;
      for (const waiter of this.pings.values()) waiter.fail(failure);
      this.pings.clear();
      this.releaseDrainWaiters();
      // A local close has no error to report; it is reported after the caller (protocolFailure)
      // had its chance to report the error that made it close.
      if (err) this.reportClose(err, byGoaway);
      else if (!this.reported) queueMicrotask(() => this.reportClose(undefined, false));
    }
  }

  private releaseDrainWaiters(): void {
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const w of waiters) w();
  }
}
