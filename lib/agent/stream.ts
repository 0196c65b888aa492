// One request and the stream that carries it: the request id (kept across reconnects), credit
// windows in both directions, and the handler that interprets the agent's answer frames.
import { TorporError } from '../errors.js';
import type { Connection } from './connection.js';
import { agentError } from './errors.js';
import { Fields, FieldWriter, ProtocolError } from './fields.js';
import { FLAG_END, FLAG_ERROR, FrameType, INITIAL_WINDOW, isDataFrame, MAX_DATA_BYTES } from './protocol.js';

/** Credit is returned once this many consumed bytes have accumulated (a quarter of the window,
 *  so the sender never stalls while we hold unreturned credit). */
const CREDIT_BATCH = INITIAL_WINDOW / 4;
/** Largest data frame we send: small enough to interleave streams fairly on one socket. */
export const SEND_CHUNK = 64 * 1024;

export interface Reissue {
  type: number;
  fields: FieldWriter;
  /** true: ask again under the same request id (the agent answers from its memory);
   *  false: a new request (e.g. ATTACH to a pid we already know). */
  sameRequestId: boolean;
}

export interface StreamHandler {
  /** A frame from the agent (ERR frames go to onError instead). */
  onFrame(type: number, flags: number, fields: Fields, stream: RequestStream): void;
  /** The request failed: an ERR from the agent, or the connection was lost for good. */
  onError(err: TorporError): void;
  /** After a reconnect: how to ask again; null fails the request with CONNECTION_CLOSED. */
  reissue?(): Reissue | null;
}

/** What RequestStream needs from the client that owns it. */
export interface StreamHost {
  connection(): Connection | null;
  register(stream: RequestStream): number;
  unregister(stream: RequestStream): void;
  newRequestId(): bigint;
  /** Tracks the request again (it was finished by a `pending` answer and is asked again). */
  revive(stream: RequestStream): void;
  /** Whether a request can still be sent (connected, or reconnecting). */
  usable(): boolean;
}

export class RequestStream {
  /** Current stream id (changes when the request is asked again on a new connection). */
  id = 0;
  requestId: bigint;
  private body: Buffer;
  private recvWindow = INITIAL_WINDOW;
  private sendWindow = INITIAL_WINDOW;
  private unreturned = 0;
  private creditWaiters: Array<() => void> = [];
  private finished = false;
  /** Cancelled or failed for good: never asked again. */
  private abandoned = false;
  private localEnded = false;
  /** The request frame went out on some connection (false: opened while reconnecting). */
  private sent = false;

  constructor(
    private readonly host: StreamHost,
    public type: number,
    fields: FieldWriter,
    readonly handler: StreamHandler,
    private readonly flags = 0,
    requestId?: bigint,
  ) {
    this.requestId = requestId ?? host.newRequestId();
    this.body = fields.toBuffer();
  }

  get done(): boolean {
    return this.finished;
  }

  /** Sends the request frame on a fresh stream id of the current connection. */
  issue(): void {
    const conn = this.host.connection();
    this.recvWindow = INITIAL_WINDOW;
    this.sendWindow = INITIAL_WINDOW;
    this.unreturned = 0;
    this.id = this.host.register(this);
    if (!conn) return; // sent when the client reconnects
    this.sent = true;
    const rid = new FieldWriter().u64('request_id', this.requestId).toBuffer();
    conn.send(this.id, this.type, this.flags, Buffer.concat([rid, this.body]));
  }

  /** Asks again after a reconnect. Returns false when the handler gave up on the request. */
  reissue(): boolean {
    // Never sent (opened while the client was reconnecting): nothing of it reached the agent,
    // so it goes out now as it is, whatever the handler would do for a request in flight.
    if (!this.sent) {
      this.issue();
      return true;
    }
    const plan = this.handler.reissue?.();
    if (!plan) return false;
    this.type = plan.type;
    this.body = plan.fields.toBuffer();
    if (!plan.sameRequestId) this.requestId = this.host.newRequestId();
    this.issue();
    return true;
  }

  /** Re-asks the same request id on a new stream (the answer was `pending`: the work is still
   *  running elsewhere). The earlier stream ended with that answer; this one starts afresh. */
  askAgain(): void {
    if (this.abandoned) return;
    if (!this.host.usable()) {
      this.abandoned = true;
      this.handler.onError(new TorporError('CONNECTION_CLOSED', `the agent connection closed while ${requestName(this.type)} was pending`));
      return;
    }
    this.host.unregister(this);
    this.finished = false;
    this.host.revive(this);
    this.issue();
  }

  /** Called by the client for every frame on this stream. */
  receive(type: number, flags: number, payload: Buffer): void {
    if (this.finished) return;
    if (type === FrameType.CREDIT) {
      const credit = Fields.parse(payload).u32('credit') ?? 0;
      this.sendWindow += credit;
      if (this.sendWindow > 0xffffffff) throw new ProtocolError(`stream ${this.id}: credit overflow`);
      const waiters = this.creditWaiters;
      this.creditWaiters = [];
      for (const w of waiters) w();
      return;
    }
    const fields = Fields.parse(payload);
    if (isDataFrame(type)) {
      this.recvWindow -= fields.bytes('data')?.length ?? 0;
      if (this.recvWindow < 0) throw new ProtocolError(`stream ${this.id}: the agent sent beyond its credit window`);
    }
    if (type === FrameType.ERR || (flags & FLAG_ERROR) !== 0) {
      this.finish();
      this.handler.onError(agentError(fields, requestName(this.type)));
      return;
    }
    const ending = (flags & FLAG_END) !== 0;
    if (ending) this.finish();
    try {
      this.handler.onFrame(type, flags, fields, this);
    } catch (err) {
      // The handler refused the frame (a ProtocolError): the connection closes, failing every
      // stream it still holds. One this frame finished is no longer held: fail it here, or its
      // request would wait forever (found by test/fuzz/host-codec-fuzz.ts).
      if (ending) this.handler.onError(err instanceof TorporError ? err : new ProtocolError(String(err)));
      throw err;
    }
  }

  /** The consumer took `bytes` of data: return credit to the agent (batched). */
  consumed(bytes: number): void {
    if (this.finished || bytes <= 0) return;
    this.recvWindow += bytes;
    this.unreturned += bytes;
    if (this.unreturned >= CREDIT_BATCH) this.returnCredit();
  }

  private returnCredit(): void {
    const conn = this.host.connection();
    if (!conn || this.unreturned === 0) return;
    conn.send(this.id, FrameType.CREDIT, 0, new FieldWriter().u32('credit', this.unreturned).toBuffer());
    this.unreturned = 0;
  }

  /** Sends `data` as data frames of `type` on this stream, waiting for credit and for the socket
   *  to drain; `end` sets END on the last frame (an empty buffer with end sends one empty frame). */
  async sendData(type: number, data: Uint8Array, end: boolean): Promise<void> {
    let pos = 0;
    do {
      if (this.finished) throw new TorporError('CONNECTION_CLOSED', `${requestName(this.type)} ended before its data was sent`);
      const conn = this.host.connection();
      if (!conn) throw new TorporError('CONNECTION_CLOSED', 'the agent connection is closed');
      while (this.sendWindow <= 0 && data.length > 0) {
        await new Promise<void>((resolve) => this.creditWaiters.push(resolve));
        if (this.finished) throw new TorporError('CONNECTION_CLOSED', `${requestName(this.type)} ended while waiting for credit`);
      }
      const n = Math.min(data.length - pos, SEND_CHUNK, this.sendWindow, MAX_DATA_BYTES);
      const last = pos + n >= data.length;
      const fw = new FieldWriter().bytes('data', data.subarray(pos, pos + n));
      conn.send(this.id, type, last && end ? FLAG_END : 0, fw.toBuffer());
      if (last && end) this.localEnded = true;
      this.sendWindow -= n;
      pos += n;
      await conn.drained();
    } while (pos < data.length);
  }

  get ended(): boolean {
    return this.localEnded;
  }

  /** Abandons the request (for exec/attach: detaches; the process keeps running). */
  cancel(): void {
    this.abandoned = true;
    if (this.finished) return;
    const conn = this.host.connection();
    conn?.send(this.id, FrameType.CANCEL, 0);
    this.finish();
  }

  /** Fails the request locally (connection lost for good). */
  fail(err: TorporError): void {
    this.abandoned = true;
    if (this.finished) return;
    this.finish();
    this.handler.onError(err);
  }

  private finish(): void {
    this.finished = true;
    this.host.unregister(this);
    const waiters = this.creditWaiters;
    this.creditWaiters = [];
    for (const w of waiters) w();
  }
}

const NAMES = new Map<number, string>(Object.entries(FrameType).map(([k, v]) => [v, k]));
export function requestName(type: number): string {
  return NAMES.get(type) ?? `request type ${type}`;
}
