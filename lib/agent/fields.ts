// Field codec: a payload is a sequence of (u16 tag, u32 len, len bytes), little-endian.
// Decoding treats its input as hostile: every field must fit, known tags must have their kind's
// size and bound, and anything else is a PROTOCOL_ERROR (the caller then closes the connection).
import { TorporError } from '../errors.js';
import { FIELD_HEADER_BYTES, FIELD_SPEC, MAX_PAYLOAD_BYTES, Tag, type TagName } from './protocol.js';

export class ProtocolError extends TorporError {
  constructor(message: string) {
    super('PROTOCOL_ERROR', message);
  }
}

const utf8 = new TextDecoder('utf-8');
/** The request_id field every request carries (added when the request is sent). */
const REQUEST_ID_FIELD_BYTES = FIELD_HEADER_BYTES + 8;
const U64_MAX = (1n << 64n) - 1n;

export type FieldValue = number | bigint | boolean | string | Uint8Array | FieldWriter;

/** Builds a payload. Values are checked against the tag's kind; oversize input from our own
 *  callers is an INVALID_ARGUMENT (it never reaches the wire). */
export class FieldWriter {
  private readonly parts: Buffer[] = [];
  private total = 0;

  /** `maxPayload`: the bound of the frame this payload goes into (an EXEC's is larger). The
   *  request id the stream adds is counted in. */
  constructor(private readonly maxPayload = MAX_PAYLOAD_BYTES) {}

  u32(tag: TagName, value: number): this {
    if (!Number.isInteger(value) || value < 0 || value > 0xffffffff) throw badValue(tag, value);
    const b = Buffer.allocUnsafe(4);
    b.writeUInt32LE(value);
    return this.raw(Tag[tag], b);
  }
  i32(tag: TagName, value: number): this {
    if (!Number.isInteger(value) || value < -0x80000000 || value > 0x7fffffff) throw badValue(tag, value);
    const b = Buffer.allocUnsafe(4);
    b.writeInt32LE(value);
    return this.raw(Tag[tag], b);
  }
  u64(tag: TagName, value: bigint | number): this {
    const v = BigInt(value);
    if (v < 0n || v > U64_MAX) throw badValue(tag, value);
    const b = Buffer.allocUnsafe(8);
    b.writeBigUInt64LE(v);
    return this.raw(Tag[tag], b);
  }
  i64(tag: TagName, value: bigint | number): this {
    const b = Buffer.allocUnsafe(8);
    b.writeBigInt64LE(BigInt(value));
    return this.raw(Tag[tag], b);
  }
  bool(tag: TagName, value: boolean): this {
    return this.raw(Tag[tag], Buffer.from([value ? 1 : 0]));
  }
  str(tag: TagName, value: string): this {
    const b = Buffer.from(value, 'utf8');
    const max = FIELD_SPEC[Tag[tag]]?.max;
    if (max !== undefined && b.length > max) {
      throw new TorporError('INVALID_ARGUMENT', `${tag} is ${b.length} bytes; the protocol allows at most ${max}`);
    }
    if (value.includes('\0')) throw new TorporError('INVALID_ARGUMENT', `${tag} must not contain a NUL character`);
    return this.raw(Tag[tag], b);
  }
  bytes(tag: TagName, value: Uint8Array): this {
    const max = FIELD_SPEC[Tag[tag]]?.max;
    if (max !== undefined && value.length > max) {
      throw new TorporError('INVALID_ARGUMENT', `${tag} is ${value.length} bytes; the protocol allows at most ${max}`);
    }
    return this.raw(Tag[tag], Buffer.from(value.buffer, value.byteOffset, value.length));
  }
  nested(tag: TagName, inner: FieldWriter): this {
    return this.raw(Tag[tag], inner.toBuffer());
  }

  /** Appends a field with an arbitrary tag (tests use it to build hostile payloads). */
  raw(tag: number, value: Buffer): this {
    const h = Buffer.allocUnsafe(FIELD_HEADER_BYTES);
    h.writeUInt16LE(tag, 0);
    h.writeUInt32LE(value.length, 2);
    this.parts.push(h, value);
    this.total += FIELD_HEADER_BYTES + value.length;
    if (this.total > this.maxPayload - REQUEST_ID_FIELD_BYTES) {
      throw new TorporError('INVALID_ARGUMENT', `request payload exceeds the protocol's ${this.maxPayload} bytes`);
    }
    return this;
  }

  get length(): number {
    return this.total;
  }
  toBuffer(): Buffer {
    return Buffer.concat(this.parts, this.total);
  }
}

function badValue(tag: string, value: unknown): TorporError {
  return new TorporError('INVALID_ARGUMENT', `${tag} has an invalid value: ${String(value)}`);
}

/** A decoded payload. Values are views into the frame's buffer (no copy). */
export class Fields {
  private constructor(private readonly byTag: Map<number, Buffer[]>) {}

  static parse(payload: Buffer): Fields {
    const byTag = new Map<number, Buffer[]>();
    let pos = 0;
    while (pos < payload.length) {
      if (payload.length - pos < FIELD_HEADER_BYTES) {
        throw new ProtocolError(`${payload.length - pos} trailing bytes are shorter than a field header`);
      }
      const tag = payload.readUInt16LE(pos);
      const len = payload.readUInt32LE(pos + 2);
      pos += FIELD_HEADER_BYTES;
      if (len > payload.length - pos) {
        throw new ProtocolError(`field ${tag} claims ${len} bytes but only ${payload.length - pos} remain`);
      }
      const value = payload.subarray(pos, pos + len);
      pos += len;
      const spec = FIELD_SPEC[tag];
      if (spec === undefined) continue; // unknown tag: skipped
      checkKind(tag, spec.kind, spec.max, value);
      const list = byTag.get(tag);
      if (list) list.push(value);
      else byTag.set(tag, [value]);
    }
    return new Fields(byTag);
  }

  has(tag: TagName): boolean {
    return this.byTag.has(Tag[tag]);
  }
  private first(tag: TagName): Buffer | undefined {
    return this.byTag.get(Tag[tag])?.[0];
  }
  u32(tag: TagName): number | undefined {
    return this.first(tag)?.readUInt32LE(0);
  }
  i32(tag: TagName): number | undefined {
    return this.first(tag)?.readInt32LE(0);
  }
  u64(tag: TagName): bigint | undefined {
    return this.first(tag)?.readBigUInt64LE(0);
  }
  /** A u64 that must fit a JS number exactly (offsets, sizes). */
  u64n(tag: TagName): number | undefined {
    const v = this.u64(tag);
    if (v === undefined) return undefined;
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new ProtocolError(`${tag} ${v} is out of range`);
    return Number(v);
  }
  i64(tag: TagName): bigint | undefined {
    return this.first(tag)?.readBigInt64LE(0);
  }
  bool(tag: TagName): boolean | undefined {
    const b = this.first(tag);
    return b === undefined ? undefined : b[0] === 1;
  }
  str(tag: TagName): string | undefined {
    const b = this.first(tag);
    return b === undefined ? undefined : utf8.decode(b);
  }
  bytes(tag: TagName): Buffer | undefined {
    return this.first(tag);
  }
  strs(tag: TagName): string[] {
    return (this.byTag.get(Tag[tag]) ?? []).map((b) => utf8.decode(b));
  }
  /** Nested field lists (entries). */
  nested(tag: TagName): Fields[] {
    return (this.byTag.get(Tag[tag]) ?? []).map((b) => Fields.parse(b));
  }
}

function checkKind(tag: number, kind: string, max: number | undefined, value: Buffer): void {
  switch (kind) {
    case 'u32':
    case 'i32':
      if (value.length !== 4) throw new ProtocolError(`field ${tag} must be 4 bytes, got ${value.length}`);
      return;
    case 'u64':
    case 'i64':
      if (value.length !== 8) throw new ProtocolError(`field ${tag} must be 8 bytes, got ${value.length}`);
      return;
    case 'bool':
      if (value.length !== 1 || (value[0] !== 0 && value[0] !== 1)) {
        throw new ProtocolError(`field ${tag} must be a 1-byte bool`);
      }
      return;
    default:
      if (max !== undefined && value.length > max) {
        throw new ProtocolError(`field ${tag} is ${value.length} bytes; at most ${max} allowed`);
      }
  }
}
