// Frame and field codecs: round trips, split delivery, and a fuzz of the decoder with random,
// truncated and mutated input (it must only ever return frames or throw PROTOCOL_ERROR).
import { randomBytes } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Fields, FieldWriter } from '../lib/agent/fields.js';
import { encodeFrame, FrameDecoder, type Frame } from '../lib/agent/frame.js';
import { FrameType, MAX_PAYLOAD_BYTES, Tag } from '../lib/agent/protocol.js';
import { TorporError } from '../lib/errors.js';

function decodeAll(bytes: Buffer, pieces: number[] = [bytes.length]): Frame[] {
  const d = new FrameDecoder();
  const out: Frame[] = [];
  let pos = 0;
  for (const n of pieces) {
    out.push(...d.push(bytes.subarray(pos, pos + n)));
    pos += n;
  }
  if (pos < bytes.length) out.push(...d.push(bytes.subarray(pos)));
  return out;
}

function isProtocolError(err: unknown): boolean {
  return err instanceof TorporError && err.code === 'PROTOCOL_ERROR';
}

test('frame round trip, byte by byte and in one piece', () => {
  const payload = new FieldWriter().u32('version', 1).str('name', 'héllo').u64('request_id', 2n ** 63n + 5n).toBuffer();
  const bytes = Buffer.concat([
    encodeFrame(0, FrameType.HELLO, 0, payload),
    encodeFrame(7, FrameType.EXITED, 1),
    encodeFrame(9, FrameType.DATA, 0, Buffer.alloc(70000, 7)),
  ]);
  for (const pieces of [[bytes.length], Array(bytes.length).fill(1), [5, 13, 100, 4096]]) {
    const frames = decodeAll(bytes, pieces);
    assert.is(frames.length, 3);
    assert.equal([frames[0]!.stream, frames[0]!.type, frames[0]!.flags], [0, FrameType.HELLO, 0]);
    const f = Fields.parse(frames[0]!.payload);
    assert.is(f.u32('version'), 1);
    assert.is(f.str('name'), 'héllo');
    assert.is(f.u64('request_id'), 2n ** 63n + 5n);
    assert.equal([frames[1]!.stream, frames[1]!.type, frames[1]!.flags, frames[1]!.payload.length], [7, FrameType.EXITED, 1, 0]);
    assert.is(frames[2]!.payload.length, 70000);
    assert.ok(frames[2]!.payload.every((b) => b === 7));
  }
});

test('oversized length is rejected from the header alone, before buffering the payload', () => {
  const h = Buffer.alloc(12);
  h.writeUInt32LE(MAX_PAYLOAD_BYTES + 1, 0);
  const d = new FrameDecoder();
  assert.throws(() => d.push(h), isProtocolError);
  assert.throws(() => d.push(Buffer.alloc(1)), isProtocolError); // stays failed
  const ok = Buffer.alloc(12);
  ok.writeUInt32LE(MAX_PAYLOAD_BYTES, 0);
  assert.equal(new FrameDecoder().push(ok), []); // exactly the maximum is fine (waits for the payload)
});

test('unknown flag bits are rejected', () => {
  const f = encodeFrame(1, FrameType.OK, 0);
  f.writeUInt16LE(4, 10);
  assert.throws(() => new FrameDecoder().push(f), isProtocolError);
});

test('fields: kinds, lists, nested entries, unknown tags skipped', () => {
  const entry = new FieldWriter().str('path', '/a').str('type', 'dir').u64('size', 4096).i64('mtime_ns', -5n);
  const p = new FieldWriter()
    .str('arg', 'ls')
    .str('arg', '-l')
    .raw(999, Buffer.from('future'))
    .bool('running', true)
    .i32('exit_code', -3)
    .nested('entry', entry)
    .toBuffer();
  const f = Fields.parse(p);
  assert.equal(f.strs('arg'), ['ls', '-l']);
  assert.is(f.bool('running'), true);
  assert.is(f.i32('exit_code'), -3);
  const [e] = f.nested('entry');
  assert.is(e!.str('type'), 'dir');
  assert.is(e!.u64n('size'), 4096);
  assert.is(e!.i64('mtime_ns'), -5n);
  assert.is(f.has('pid'), false);
});

test('fields: malformed payloads are PROTOCOL_ERROR', () => {
  const bad: Array<[string, Buffer]> = [
    ['truncated header', Buffer.from([1, 0, 4])],
    ['field longer than payload', (() => { const b = Buffer.alloc(8); b.writeUInt16LE(Tag.pid, 0); b.writeUInt32LE(100, 2); return b; })()],
    ['u32 of 3 bytes', new FieldWriter().raw(Tag.pid, Buffer.alloc(3)).toBuffer()],
    ['u64 of 4 bytes', new FieldWriter().raw(Tag.request_id, Buffer.alloc(4)).toBuffer()],
    ['bool of 2', new FieldWriter().raw(Tag.running, Buffer.from([2])).toBuffer()],
    ['nonce > 64', new FieldWriter().raw(Tag.nonce, Buffer.alloc(65)).toBuffer()],
    ['path > 4096', new FieldWriter().raw(Tag.path, Buffer.alloc(4097, 97)).toBuffer()],
    ['tag label > 256', new FieldWriter().raw(Tag.tag, Buffer.alloc(257, 97)).toBuffer()],
  ];
  for (const [what, payload] of bad) {
    assert.throws(() => Fields.parse(payload), isProtocolError, what);
  }
});

test('field writer refuses oversize values with INVALID_ARGUMENT', () => {
  const isInvalid = (e: unknown) => e instanceof TorporError && e.code === 'INVALID_ARGUMENT';
  assert.throws(() => new FieldWriter().str('path', 'x'.repeat(4097)), isInvalid);
  assert.throws(() => new FieldWriter().u32('pid', -1), isInvalid);
  assert.throws(() => new FieldWriter().u32('pid', 2 ** 32), isInvalid);
  assert.throws(() => new FieldWriter().str('arg', 'a\0b'), isInvalid);
  assert.throws(() => new FieldWriter().bytes('data', new Uint8Array(MAX_PAYLOAD_BYTES)), isInvalid);
});

// Deterministic PRNG so a failure reproduces.
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 0x100000000;
  };
}

test('fuzz: random, truncated and mutated frames only yield frames or PROTOCOL_ERROR', () => {
  const rand = rng(0x7051);
  const valid: Buffer[] = [];
  for (let i = 0; i < 50; i++) {
    const fw = new FieldWriter();
    const n = Math.floor(rand() * 6);
    for (let j = 0; j < n; j++) {
      const choice = Math.floor(rand() * 5);
      if (choice === 0) fw.u32('pid', Math.floor(rand() * 1e6));
      else if (choice === 1) fw.str('path', '/tmp/' + 'x'.repeat(Math.floor(rand() * 100)));
      else if (choice === 2) fw.bytes('data', randomBytes(Math.floor(rand() * 3000)));
      else if (choice === 3) fw.bool('recursive', rand() < 0.5);
      else fw.nested('entry', new FieldWriter().str('type', 'file').u64('size', 1));
    }
    valid.push(encodeFrame(1 + 2 * i, 16 + Math.floor(rand() * 60), rand() < 0.3 ? 1 : 0, fw.toBuffer()));
  }
  let frames = 0;
  let rejected = 0;
  for (let iter = 0; iter < 3000; iter++) {
    const base = Buffer.from(valid[Math.floor(rand() * valid.length)]!);
    let input: Buffer;
    const mode = iter % 4;
    if (mode === 0) input = randomBytes(Math.floor(rand() * 200));
    else if (mode === 1) input = base.subarray(0, Math.floor(rand() * base.length));
    else {
      input = base;
      const flips = 1 + Math.floor(rand() * 8);
      for (let k = 0; k < flips; k++) input[Math.floor(rand() * input.length)] = Math.floor(rand() * 256);
    }
    const d = new FrameDecoder();
    try {
      // split at a random point: the decoder must not care how the bytes arrive
      const cut = Math.floor(rand() * (input.length + 1));
      const got = [...d.push(input.subarray(0, cut)), ...d.push(input.subarray(cut))];
      for (const fr of got) {
        frames++;
        try {
          const f = Fields.parse(fr.payload);
          f.nested('entry');
        } catch (err) {
          if (!isProtocolError(err)) throw err;
          rejected++;
        }
      }
      assert.ok(d.pending <= 12 + MAX_PAYLOAD_BYTES);
    } catch (err) {
      if (!isProtocolError(err)) throw err;
      rejected++;
    }
  }
  assert.ok(frames > 100, `decoded ${frames} frames`);
  assert.ok(rejected > 100, `rejected ${rejected}`);
});

test.run();
