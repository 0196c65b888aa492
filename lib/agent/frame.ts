// Frame codec: 12-byte header (length u32, stream u32, type u16, flags u16, little-endian) then
// `length` payload bytes. The decoder is incremental (a byte stream arrives in arbitrary pieces)
// and bounded: it never holds more than one header plus one maximal payload, and rejects a
// length over MAX_PAYLOAD_BYTES or unknown flag bits before buffering the payload.
import { ProtocolError } from './fields.js';
import { FRAME_HEADER_BYTES, KNOWN_FLAGS, MAX_PAYLOAD_BYTES, maxPayloadFor } from './protocol.js';

export interface Frame {
  stream: number;
  type: number;
  flags: number;
  payload: Buffer;
}

export function encodeFrame(stream: number, type: number, flags: number, payload: Buffer = EMPTY): Buffer {
  if (payload.length > maxPayloadFor(type)) {
    throw new ProtocolError(`frame payload of ${payload.length} bytes exceeds ${maxPayloadFor(type)}`);
  }
  const out = Buffer.allocUnsafe(FRAME_HEADER_BYTES + payload.length);
  writeHeader(out, payload.length, stream, type, flags);
  payload.copy(out, FRAME_HEADER_BYTES);
  return out;
}

/** Header only, for callers that write header and payload separately (large data). */
export function encodeHeader(length: number, stream: number, type: number, flags: number): Buffer {
  const out = Buffer.allocUnsafe(FRAME_HEADER_BYTES);
  writeHeader(out, length, stream, type, flags);
  return out;
}

function writeHeader(out: Buffer, length: number, stream: number, type: number, flags: number): void {
  out.writeUInt32LE(length, 0);
  out.writeUInt32LE(stream, 4);
  out.writeUInt16LE(type, 8);
  out.writeUInt16LE(flags, 10);
}

const EMPTY = Buffer.alloc(0);

export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private header: { length: number; stream: number; type: number; flags: number } | null = null;
  private failed = false;

  /** Feeds bytes; returns the frames they complete. Throws ProtocolError on malformed input,
   *  after which the decoder refuses further input (the connection must be closed). */
  push(chunk: Buffer): Frame[] {
    if (this.failed) throw new ProtocolError('decoder already failed');
    if (chunk.length > 0) {
      this.chunks.push(chunk);
      this.buffered += chunk.length;
    }
    const frames: Frame[] = [];
    for (;;) {
      if (this.header === null) {
        if (this.buffered < FRAME_HEADER_BYTES) break;
        const h = this.take(FRAME_HEADER_BYTES);
        const length = h.readUInt32LE(0);
        const flags = h.readUInt16LE(10);
        if (length > MAX_PAYLOAD_BYTES) {
          this.failed = true;
          throw new ProtocolError(`frame length ${length} exceeds ${MAX_PAYLOAD_BYTES}`);
        }
        if ((flags & ~KNOWN_FLAGS) !== 0) {
          this.failed = true;
          throw new ProtocolError(`frame has unknown flag bits 0x${flags.toString(16)}`);
        }
        this.header = { length, stream: h.readUInt32LE(4), type: h.readUInt16LE(8), flags };
      }
      if (this.buffered < this.header.length) break;
      const payload = this.header.length === 0 ? EMPTY : this.take(this.header.length);
      frames.push({ stream: this.header.stream, type: this.header.type, flags: this.header.flags, payload });
      this.header = null;
    }
    return frames;
  }

  /** Bytes held that do not form a complete frame yet. */
  get pending(): number {
    return this.buffered + (this.header ? FRAME_HEADER_BYTES : 0);
  }

  private take(n: number): Buffer {
    const first = this.chunks[0]!;
    if (first.length >= n) {
      const out = first.subarray(0, n);
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      this.buffered -= n;
      return out;
    }
    const out = Buffer.allocUnsafe(n);
    let filled = 0;
    while (filled < n) {
      const c = this.chunks[0]!;
      const want = n - filled;
      if (c.length <= want) {
        c.copy(out, filled);
        filled += c.length;
        this.chunks.shift();
      } else {
        c.copy(out, filled, 0, want);
        this.chunks[0] = c.subarray(want);
        filled += want;
      }
    }
    this.buffered -= n;
    return out;
  }
}
