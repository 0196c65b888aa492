// Fuzz target: the agent protocol as the HOST reads it (lib/agent and the API over it), the side
// a hostile guest talks to. Structure-aware random inputs, no coverage feedback (the native
// targets have libFuzzer; this one runs in Node):
// - codec: byte streams (the agent_frame seed corpus, frames built from every response type with
//   random fields, and mutations of both) fed to FrameDecoder in random pieces; every payload
//   walked with Fields.parse and every accessor of its tags. Allowed outcomes: frames, or a
//   PROTOCOL_ERROR. Invariants: the frames (or the error) do not depend on how the stream was
//   cut (a push that throws drops the frames it completed: only the error is compared then); a decoded frame re-encodes to its own bytes; the decoder never holds more than a
//   header plus one maximal payload.
// - session: an AgentClient on an in-memory duplex whose "agent" answers HELLO, then answers
//   each request of the public API (commands.run, files.read, files.list, files.getInfo, ping)
//   with mutated response frames. Allowed outcomes: a result, or a TorporError with a code.
//   Invariants: nothing escapes as an uncaught exception or unhandled rejection, and every
//   request settles once the connection ends.
// A failing input is written to $FUZZ_WORK/artifacts/host_codec-crash-<n> (hex) and the run exits 1.
//
//   node --import tsx test/fuzz/host-codec-fuzz.ts [seconds=60] [seed]
// Prints inputs, inputs per second and the outcomes seen, in the format campaign.sh reads.
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Duplex, PassThrough } from 'node:stream';
import { fileURLToPath } from 'node:url';

import { AgentClient } from '../../lib/agent/client.js';
import { FieldWriter, Fields, ProtocolError } from '../../lib/agent/fields.js';
import { FrameDecoder, encodeFrame, type Frame } from '../../lib/agent/frame.js';
import { FIELD_SPEC, FLAG_END, FLAG_ERROR, FRAME_HEADER_BYTES, FrameType, MAX_PAYLOAD_BYTES, Tag, type TagName } from '../../lib/agent/protocol.js';
import { TorporError } from '../../lib/errors.js';
import { createAgentApi } from '../../lib/sandbox/agent-api.js';

const here = dirname(fileURLToPath(import.meta.url));
const seconds = Number(process.argv[2] ?? 60);
let seed = Number(process.argv[3] ?? Date.now() % 0x7fffffff) >>> 0;
const work = process.env.FUZZ_WORK ?? join(here, '../../native/test/out/fuzz/work');

// xorshift32: reproducible from the printed seed.
function rand(): number {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed;
}
const below = (n: number) => rand() % Math.max(1, n);
const pick = <T>(xs: readonly T[]): T => xs[below(xs.length)]!;

// ---------------------------------------------------------------- inputs

const tagNames = Object.keys(Tag) as TagName[];
const responseTypes = [FrameType.OK, FrameType.STARTED, FrameType.STDOUT, FrameType.STDERR, FrameType.EXITED, FrameType.DATA, FrameType.ERR, FrameType.EVENT, FrameType.CREDIT, FrameType.PONG, FrameType.GOAWAY, FrameType.HELLO];

/** A field of a known tag with a value of its kind (sometimes of the wrong size or over its bound). */
function randomField(w: FieldWriter, depth = 0): void {
  const tag = pick(tagNames);
  const spec = FIELD_SPEC[Tag[tag]]!;
  if (below(16) === 0) {
    w.raw(below(8) === 0 ? below(0x10000) : Tag[tag], Buffer.alloc(below(24), below(256)));
    return;
  }
  switch (spec.kind) {
    case 'u32':
      w.u32(tag, pick([0, 1, 2, 0x7fffffff, 0xffffffff, below(1 << 20)]));
      return;
    case 'i32':
      w.i32(tag, pick([0, 1, -1, 255, -0x80000000, 0x7fffffff]));
      return;
    case 'u64':
      w.u64(tag, pick([0n, 1n, 4096n, BigInt(Number.MAX_SAFE_INTEGER) + 1n, (1n << 64n) - 1n, BigInt(below(1 << 30))]));
      return;
    case 'i64':
      w.i64(tag, pick([0n, -1n, 1n << 62n, -(1n << 63n), BigInt(Date.now()) * 1_000_000n]));
      return;
    case 'bool':
      w.bool(tag, below(2) === 0);
      return;
    default:
      if (tag === 'entry' && depth < 2) {
        const inner = new FieldWriter();
        for (let i = below(5); i > 0; i--) randomField(inner, depth + 1);
        w.nested('entry', inner);
        return;
      }
      w.raw(Tag[tag], Buffer.from(pick(['', 'x', '/tmp/f', 'file', 'dir', 'symlink', 'ENOENT', 'é', '\u0000', 'a'.repeat(below(300))]), 'utf8'));
  }
}

function randomFrame(stream: number): Buffer {
  const w = new FieldWriter(MAX_PAYLOAD_BYTES + 64);
  for (let i = below(7); i > 0; i--) randomField(w);
  const flags = pick([0, FLAG_END, FLAG_ERROR, FLAG_END | FLAG_ERROR, 0, FLAG_END]);
  return encodeFrame(stream, pick(responseTypes), flags, w.toBuffer());
}

function mutate(b: Buffer): Buffer {
  let out = Buffer.from(b);
  for (let n = 1 + below(4); n > 0; n--) {
    switch (below(7)) {
      case 0: // flip a bit
        if (out.length) out[below(out.length)]! ^= 1 << below(8);
        break;
      case 1: // an interesting byte
        if (out.length) out[below(out.length)] = pick([0, 1, 0x7f, 0x80, 0xff]);
        break;
      case 2: // an interesting u32 (lengths)
        if (out.length >= 4) out.writeUInt32LE(pick([0, 1, 5, 6, 12, 0xffff, MAX_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES + 1, 0xffffffff]), below(out.length - 3));
        break;
      case 3: // cut
        out = out.subarray(0, below(out.length + 1));
        break;
      case 4: // duplicate a slice
        if (out.length) {
          const at = below(out.length);
          out = Buffer.concat([out, out.subarray(at, at + 1 + below(64))]);
        }
        break;
      case 5: // splice another frame in
        out = Buffer.concat([out.subarray(0, below(out.length + 1)), randomFrame(below(4))]);
        break;
      default: // random bytes
        out = Buffer.concat([out, Buffer.from(Array.from({ length: 1 + below(16) }, () => below(256)))]);
    }
  }
  return out;
}

const corpusDir = join(here, '../../native/fuzz/corpus/agent_frame');
const seeds: Buffer[] = readdirSync(corpusDir).map((f) => readFileSync(join(corpusDir, f)));

function nextStream(): Buffer {
  const r = below(4);
  if (r === 0) return mutate(pick(seeds));
  if (r === 1) return Buffer.concat(Array.from({ length: 1 + below(3) }, () => randomFrame(below(5))));
  return mutate(Buffer.concat(Array.from({ length: 1 + below(3) }, () => randomFrame(below(5)))));
}

// ---------------------------------------------------------------- codec

class Finding extends Error {}
const outcomes: Record<string, number> = {};
const count = (what: string) => (outcomes[what] = (outcomes[what] ?? 0) + 1);

/** Walks a payload with every accessor its tags allow (what the API layer does with it). */
function walk(payload: Buffer, depth = 0): void {
  const f = Fields.parse(payload);
  for (const tag of tagNames) {
    if (!f.has(tag)) continue;
    const kind = FIELD_SPEC[Tag[tag]]!.kind;
    if (kind === 'u32') f.u32(tag);
    else if (kind === 'i32') f.i32(tag);
    else if (kind === 'u64') {
      f.u64(tag);
      try {
        f.u64n(tag);
      } catch (err) {
        if (!(err instanceof ProtocolError)) throw err;
      }
    } else if (kind === 'i64') f.i64(tag);
    else if (kind === 'bool') f.bool(tag);
    else if (kind === 'str') f.strs(tag);
    else if (tag === 'entry' && depth < 3) for (const e of f.bytes(tag) ? [f.bytes(tag)!] : []) walk(e, depth + 1);
    else f.bytes(tag);
  }
}

/** Decodes `bytes` cut at the given points; returns the frames and how it ended. */
function decode(bytes: Buffer, cuts: number[]): { frames: Frame[]; error: string | null; heldMax: number } {
  const dec = new FrameDecoder();
  const frames: Frame[] = [];
  let at = 0;
  let heldMax = 0;
  for (const cut of [...cuts, bytes.length]) {
    try {
      frames.push(...dec.push(bytes.subarray(at, cut)));
    } catch (err) {
      if (err instanceof ProtocolError) return { frames, error: err.message, heldMax };
      throw err;
    }
    heldMax = Math.max(heldMax, dec.pending);
    at = cut;
  }
  return { frames, error: null, heldMax };
}

function codecCase(bytes: Buffer): void {
  const cuts: number[] = [];
  for (let at = 0; at < bytes.length; ) {
    at += 1 + below(below(4) === 0 ? 8 : 200);
    if (at < bytes.length) cuts.push(at);
  }
  const whole = decode(bytes, []);
  const pieces = decode(bytes, cuts);
  if (whole.error !== pieces.error) throw new Finding(`the error depends on the cuts: ${whole.error} / ${pieces.error}`);
  // A push that throws drops the frames it completed before the error (the connection closes
  // anyway): with an error, only the error itself must not depend on the cuts.
  if (!whole.error && whole.frames.length !== pieces.frames.length) throw new Finding('the frames depend on the cuts');
  if (pieces.heldMax > FRAME_HEADER_BYTES + MAX_PAYLOAD_BYTES) throw new Finding(`the decoder held ${pieces.heldMax} bytes`);
  let offset = 0;
  for (let i = 0; i < (whole.error ? 0 : whole.frames.length); i++) {
    const a = whole.frames[i]!;
    const b = pieces.frames[i]!;
    if (a.stream !== b.stream || a.type !== b.type || a.flags !== b.flags || !a.payload.equals(b.payload)) throw new Finding(`frame ${i} depends on the cuts`);
    const own = bytes.subarray(offset, offset + FRAME_HEADER_BYTES + a.payload.length);
    if (!encodeFrame(a.stream, a.type, a.flags, a.payload).equals(own)) throw new Finding(`frame ${i} does not re-encode to its bytes`);
    offset += own.length;
    try {
      walk(a.payload);
      count('codec: payload walked');
    } catch (err) {
      if (!(err instanceof ProtocolError)) throw err;
      count('codec: payload PROTOCOL_ERROR');
    }
  }
  count(whole.error ? 'codec: stream PROTOCOL_ERROR' : 'codec: stream decoded');
}

// ---------------------------------------------------------------- session

function duplexPair(): [Duplex, Duplex] {
  const aToB = new PassThrough();
  const bToA = new PassThrough();
  return [Duplex.from({ readable: bToA, writable: aToB }), Duplex.from({ readable: aToB, writable: bToA })];
}

const HELLO = encodeFrame(0, FrameType.HELLO, 0, new FieldWriter().u32('version', 1).u64('features', 0xffffn).str('name', 'fuzz').toBuffer());

/** Plausible answers to a request on `stream`, then mutated. */
function answerFor(type: number, stream: number): Buffer {
  const end = FLAG_END;
  const ok = (w: FieldWriter, flags = end) => encodeFrame(stream, FrameType.OK, flags, w.toBuffer());
  let plain: Buffer;
  switch (type) {
    case FrameType.EXEC:
      plain = Buffer.concat([
        encodeFrame(stream, FrameType.STARTED, 0, new FieldWriter().u32('pid', 1 + below(1000)).toBuffer()),
        encodeFrame(stream, FrameType.STDOUT, 0, new FieldWriter().u64('offset', 0n).bytes('data', Buffer.from('out\n')).toBuffer()),
        encodeFrame(stream, FrameType.EXITED, end, new FieldWriter().i32('exit_code', below(3)).toBuffer()),
      ]);
      break;
    case FrameType.FILE_READ:
      plain = Buffer.concat([ok(new FieldWriter().u64('size', 5n), 0), encodeFrame(stream, FrameType.DATA, end, new FieldWriter().bytes('data', Buffer.from('hello')).toBuffer())]);
      break;
    case FrameType.FILE_LIST: {
      const entry = () => new FieldWriter().str('name', pick(['a', 'b', '..'])).str('type', pick(['file', 'dir', 'symlink', 'weird'])).u64('size', 3n).str('path', '/tmp/a');
      const w = new FieldWriter();
      for (let i = below(4); i > 0; i--) w.nested('entry', entry());
      plain = ok(w);
      break;
    }
    default:
      plain = ok(new FieldWriter().str('type', 'file').u64('size', 1n).u32('mode', 0o644).i64('mtime_ns', 0n).str('name', 'f'));
  }
  if (below(8) === 0) return Buffer.concat([plain, randomFrame(stream)]);
  return below(4) === 0 ? plain : mutate(plain);
}

async function sessionCase(log: Buffer[]): Promise<void> {
  const [hostEnd, agentEnd] = duplexPair();
  const dec = new FrameDecoder();
  agentEnd.on('data', (d: Buffer) => {
    let frames: Frame[];
    try {
      frames = dec.push(d);
    } catch {
      return; // our own client sent garbage: the codec half of the target would have caught it
    }
    for (const f of frames) {
      if (f.type === FrameType.HELLO) agentEnd.write(HELLO);
      else if (f.type === FrameType.PING) agentEnd.write(below(2) ? encodeFrame(0, FrameType.PONG, 0, f.payload) : mutate(encodeFrame(0, FrameType.PONG, 0, f.payload)));
      else if (f.stream !== 0 && f.type !== FrameType.CREDIT && f.type !== FrameType.CANCEL && f.type !== FrameType.STDIN) {
        const answer = answerFor(f.type, f.stream);
        log.push(answer);
        agentEnd.write(answer);
      }
    }
  });
  agentEnd.on('error', () => undefined);
  const client = await AgentClient.connect(hostEnd, { helloTimeoutMs: 2000 });
  const api = createAgentApi(client);
  const names = ['commands.run', 'files.read', 'files.list', 'files.getInfo', 'ping'];
  const pending = new Set(names);
  const requests: Promise<unknown>[] = [
    api.commands.run('echo out', { timeoutMs: 2000 }),
    api.files.read('/tmp/f'),
    api.files.list('/tmp'),
    api.files.getInfo('/tmp/f'),
    client.ping(),
  ].map((p, i) => p.finally(() => pending.delete(names[i]!)));
  // Some answers never end a request: the connection ending must settle every one.
  setTimeout(() => agentEnd.destroy(), 20).unref();
  const settled = await Promise.race([
    Promise.allSettled(requests),
    new Promise<null>((r) => setTimeout(() => r(null), 5000)),
  ]);
  await client.close();
  if (settled === null) throw new Finding(`a request never settled after the connection ended: ${[...pending].join(', ')}`);
  for (const s of settled) {
    if (s.status === 'fulfilled') count('session: answered');
    else if (s.reason instanceof TorporError && s.reason.code) count(`session: ${s.reason.code}`);
    else throw new Finding(`a request failed with a non-TorporError: ${String(s.reason)}`);
  }
}

// ---------------------------------------------------------------- driver

let current: Buffer[] = [];
let inputs = 0;
function fail(why: unknown): never {
  mkdirSync(join(work, 'artifacts'), { recursive: true });
  const file = join(work, 'artifacts', `host_codec-crash-${Date.now()}`);
  writeFileSync(file, current.map((b) => b.toString('hex')).join('\n') + '\n');
  console.error(`host_codec: FAILED after ${inputs} inputs: ${why instanceof Error ? why.stack : String(why)}\nreproducer (hex, one stream per line): ${file}`);
  process.exit(1);
}
process.on('uncaughtException', fail);
process.on('unhandledRejection', fail);

const startSeed = seed;
const t0 = performance.now();
const deadline = t0 + seconds * 1000;
// campaign.sh's FUZZ_RUNS: stop once this many inputs ran (the time still caps the run).
const maxInputs = Number(process.env.FUZZ_RUNS) || Infinity;
try {
  while (performance.now() < deadline && inputs < maxInputs) {
    for (let i = 0; i < 200; i++, inputs++) {
      const bytes = nextStream();
      current = [bytes];
      codecCase(bytes);
    }
    current = [];
    await sessionCase(current);
    inputs++;
  }
} catch (err) {
  fail(err);
}
const secs = (performance.now() - t0) / 1000;
for (const [k, v] of Object.entries(outcomes).sort()) console.log(`  ${k}: ${v}`);
console.log(`stat::number_of_executed_units: ${inputs}`);
console.log(`stat::average_exec_per_sec: ${Math.round(inputs / secs)}`);
console.log(`host_codec: ${inputs} inputs in ${secs.toFixed(1)} s, seed ${startSeed}, no failure`);
