// The AgentClient against the real agent on the host: HELLO, PING, ECHO, request ids re-asked
// across sessions, reconnect, and hostile frames from either side.
import { randomBytes } from 'node:crypto';
import { readFile, rm } from 'node:fs/promises';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { AgentClient } from '../lib/agent/client.js';
import { Fields, FieldWriter } from '../lib/agent/fields.js';
import { encodeFrame, FrameDecoder } from '../lib/agent/frame.js';
import { dialUnix, startHostAgent, type HostAgent } from '../lib/agent/host.js';
import { FLAG_END, FrameType, PROTOCOL_VERSION } from '../lib/agent/protocol.js';
import { createAgentApi } from '../lib/sandbox/agent-api.js';
import { TorporError } from '../lib/errors.js';
import { cleanEnv, ensureAgentBuilt, sleep } from './agent-harness.js';

let agent: HostAgent;
test.before(async () => {
  ensureAgentBuilt();
  agent = await startHostAgent({ env: cleanEnv() });
});
test.after(async () => {
  await agent?.stop();
});

const code = (c: string) => (e: unknown) => e instanceof TorporError && e.code === c;

test('GROW_FS on the host: answers the sizes, never resizes', async () => {
  const c = await agent.client();
  assert.ok(c.supports('grow_fs'));
  const r = await c.call(FrameType.GROW_FS, new FieldWriter().str('path', '/')).catch((e: unknown) => e);
  if (r instanceof TorporError) {
    // Not ext4 here, or no /sys/dev/block entry for the root's device (a container's overlay).
    assert.ok(['INVALID_ARGUMENT', 'FILE_NOT_FOUND', 'REQUEST_FAILED'].includes(r.code), r.message);
  } else {
    const f = r as Fields;
    assert.ok((f.u64n('size') ?? 0) > 0);
    assert.ok((f.u64n('fs_size') ?? 0) > 0);
    assert.is(f.str('message'), 'host mode: not resized');
    // A device smaller than asked (the guest's driver has not seen the new capacity yet): nothing attempted.
    const early = await c.call(FrameType.GROW_FS, new FieldWriter().str('path', '/').u64('size', 2n ** 60n));
    assert.is(early.str('message'), undefined);
  }
  const notDir = await c.call(FrameType.GROW_FS, new FieldWriter().str('path', '/dev/null')).catch((e: unknown) => e);
  assert.ok(notDir instanceof TorporError && notDir.code === 'NOT_A_DIRECTORY', String(notDir));
  await c.close();
});

test('RESUMED with an identity on the host: checked, then the host left alone', async () => {
  const c = await agent.client();
  assert.ok(c.supports('identity'));
  const hostname = (await readFile('/proc/sys/kernel/hostname', 'utf8')).trim();
  const good = () => new FieldWriter().str('hostname', 'sbx-0123456789abcdef').str('machine_id', '0123456789abcdef0123456789abcdef');
  const ok = await c.call(FrameType.RESUMED, good().bytes('mac', Buffer.from('02aabbccddee', 'hex')));
  assert.is(ok.str('message'), 'host mode: clock, RNG and identity left alone');
  assert.is((await readFile('/proc/sys/kernel/hostname', 'utf8')).trim(), hostname);
  // Refused before anything is applied: a name that is no DNS label, a malformed id, a multicast MAC.
  for (const bad of [
    new FieldWriter().str('hostname', 'sbx_0123'),
    new FieldWriter().str('hostname', ''),
    new FieldWriter().str('machine_id', '00000000000000000000000000000000'),
    new FieldWriter().str('machine_id', '0123456789ABCDEF0123456789abcdef'),
    good().bytes('mac', Buffer.from('01aabbccddee', 'hex')),
  ]) {
    const r = await c.call(FrameType.RESUMED, bad).catch((e: unknown) => e);
    assert.ok(code('INVALID_ARGUMENT')(r), String(r));
  }
  // Wrong sizes never reach the handler: the frame reader refuses them (the stream ends with an error).
  const short = await c.call(FrameType.RESUMED, new FieldWriter().str('machine_id', 'abc')).catch((e: unknown) => e);
  assert.ok(short instanceof TorporError, String(short));
  await c.close();
});

test('HELLO, PING, ECHO', async () => {
  const c = await agent.client();
  assert.is(c.hello.version, PROTOCOL_VERSION);
  for (const f of ['exec', 'pty', 'files', 'attach', 'resumed', 'request_ids'] as const) assert.ok(c.supports(f), f);
  assert.match(c.hello.name, /^torpor-agent/);
  const skewMs = Math.abs(Number(c.hello.timeNs / 1_000_000n) - Date.now());
  assert.ok(skewMs < 60_000, `agent clock within a minute (${skewMs} ms)`);
  const rtt = await c.ping();
  assert.ok(rtt > 0 && rtt < 100, `rtt ${rtt} ms`);
  const payload = randomBytes(100_000);
  const echoed = await c.call(FrameType.ECHO, new FieldWriter().bytes('data', payload));
  assert.ok(echoed.bytes('data')!.equals(payload));
  await c.close();
  assert.ok(code('CONNECTION_CLOSED')(await c.ping().catch((e) => e)));
});

test('connectExpecting: a request written behind HELLO, before its answer, is answered by the real agent', async () => {
  const first = await agent.client();
  const expected = first.hello;
  await first.close();
  let reads = 0;
  let sent: Buffer[] = [];
  let flushes = 0;
  const { client, hello } = await AgentClient.connectExpecting(async () => {
    const s = await dialUnix(agent.socketPath);
    s.on('data', () => reads++);
    // What the stream hands its transport: one _writev of both frames (corked), or one _write each.
    const impl = s as unknown as { _write: (...a: unknown[]) => void; _writev: (...a: unknown[]) => void };
    const write = impl._write.bind(s);
    impl._write = (chunk: unknown, ...rest: unknown[]) => {
      flushes++;
      sent = [chunk as Buffer];
      write(chunk, ...rest);
    };
    const writev = impl._writev.bind(s);
    impl._writev = (chunks: unknown, ...rest: unknown[]) => {
      flushes++;
      sent = (chunks as Array<{ chunk: Buffer }>).map((c) => c.chunk);
      writev(chunks, ...rest);
    };
    return s;
  }, expected);
  // Usable at once: the request is made in the same turn as HELLO, before any answer came.
  assert.ok(client.supports('resumed'));
  const payload = randomBytes(1000);
  const echoed = client.call(FrameType.ECHO, new FieldWriter().bytes('data', payload));
  assert.is(reads, 0, 'nothing read yet');
  const got = await hello;
  assert.is(flushes, 1, 'HELLO and the request left in one write');
  const frames = new FrameDecoder().push(Buffer.concat(sent));
  assert.equal(frames.map((f) => f.type), [FrameType.HELLO, FrameType.ECHO]);
  assert.is(got.version, PROTOCOL_VERSION);
  assert.match(got.name, /^torpor-agent/);
  assert.ok((await echoed).bytes('data')!.equals(payload));
  // The answer's own clock, features as expected.
  assert.ok(client.hello.timeNs > 0n);
  assert.is(client.hello.features, expected.features);
  await client.close();
});

test('connectExpecting: an agent that lacks an expected feature is refused, the request made meanwhile fails, no redial', async () => {
  const first = await agent.client();
  const expected = { ...first.hello, features: first.hello.features | (1n << 40n) };
  await first.close();
  let dials = 0;
  const { client, hello } = await AgentClient.connectExpecting(
    () => {
      dials++;
      return dialUnix(agent.socketPath);
    },
    expected,
    { reconnect: true },
  );
  const pending = client.call(FrameType.ECHO, new FieldWriter().bytes('data', Buffer.from('x'))).catch((e: unknown) => e);
  const err = await hello.catch((e: unknown) => e);
  assert.ok(code('PROTOCOL_ERROR')(err), String(err));
  assert.match((err as Error).message, /lacking features 0x10000000000/);
  const p = await pending; assert.ok(code('PROTOCOL_ERROR')(p), 'the request fails with the reason: ' + String(p));
  await sleep(100);
  assert.is(dials, 1, 'no redial');
  assert.ok(client.closed);
});

test('connectExpecting: HELLO unanswered within its time: GUEST_UNRESPONSIVE for HELLO and the request, no redial', async () => {
  let connections = 0;
  const server = createServer((sock) => {
    connections++;
    sock.on('data', () => undefined); // reads, never answers
    sock.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  const { connect } = await import('node:net');
  const expected = { version: PROTOCOL_VERSION, features: 1n, name: 'x', timeNs: 0n };
  const { client, hello } = await AgentClient.connectExpecting(
    () =>
      new Promise((resolve) => {
        const s = connect(port, '127.0.0.1', () => resolve(s));
      }),
    expected,
    { reconnect: true, helloTimeoutMs: 200 },
  );
  const pending = client.call(FrameType.SYNC, new FieldWriter()).catch((e: unknown) => e);
  assert.ok(code('GUEST_UNRESPONSIVE')(await hello.catch((e: unknown) => e)));
  assert.ok(code('GUEST_UNRESPONSIVE')(await pending));
  await sleep(100);
  assert.is(connections, 1, 'no redial');
  server.close();
});

test('a re-asked request id does not run the command twice', async () => {
  const marker = join(tmpdir(), `torpor-reask-${process.pid}-${Date.now()}`);
  const rid = (BigInt(Date.now()) << 20n) | 7n;
  const fields = () => new FieldWriter().str('shell', `echo ran >> ${marker}; sleep 0.3; echo done`);
  const a = await agent.client();
  const b = await agent.client();
  try {
    const outA: string[] = [];
    const first = openExec(a, fields(), rid, outA);
    const pidA = (await first.started).pid;
    // The same id from another session: the agent attaches to the same process from offset 0.
    const outB: string[] = [];
    const second = openExec(b, fields(), rid, outB);
    const pidB = (await second.started).pid;
    assert.is(pidB, pidA);
    await Promise.all([first.exited, second.exited]);
    assert.is(outA.join(''), 'done\n');
    assert.is(outB.join(''), 'done\n');
    assert.is(await readFile(marker, 'utf8'), 'ran\n');
    // A finished non-exec request is answered from memory: a second RENAME would fail.
    await createAgentApi(a).files.write(marker + '.src', 'x');
    const renameId = rid + 1000n;
    const ren = () => new FieldWriter().str('path', marker + '.src').str('path2', marker + '.dst');
    await a.call(FrameType.RENAME, ren(), { requestId: renameId });
    await b.call(FrameType.RENAME, ren(), { requestId: renameId });
    const fresh = await b.call(FrameType.RENAME, ren()).catch((e) => e);
    assert.ok(code('FILE_NOT_FOUND')(fresh), 'the same request under a new id does run (and fails)');
  } finally {
    await a.close();
    await b.close();
    await rm(marker, { force: true });
    await rm(marker + '.dst', { force: true });
  }
});

test('a re-asked request still in progress answers pending; the client asks again until it is done', async () => {
  const path = join(tmpdir(), `torpor-pending-${process.pid}-${Date.now()}`);
  const rid = (BigInt(Date.now()) << 20n) | 99n;
  const a = await agent.client();
  const b = await agent.client();
  try {
    let okA!: (f: Fields) => void;
    const answerA = new Promise<Fields>((r) => (okA = r));
    const fields = () => new FieldWriter().str('path', path).u32('mode', 0o644);
    const writer = a.open(FrameType.FILE_WRITE, fields(), {
      onFrame: (type, _flags, f) => type === FrameType.OK && okA(f),
      onError: (e) => {
        throw e;
      },
    }, { requestId: rid });
    await writer.sendData(FrameType.DATA, Buffer.from('first half, '), false);
    // Session b asks about the same request while a is still writing.
    const answerB = b.call(FrameType.FILE_WRITE, fields(), { requestId: rid });
    await sleep(150); // b has been told `pending` and keeps asking
    await writer.sendData(FrameType.DATA, Buffer.from('second half'), true);
    const [fa, fb] = await Promise.all([answerA, answerB]);
    assert.is(fa.u64n('size'), 23);
    assert.is(fb.u64n('size'), 23, 'b got the remembered answer');
    assert.is(await readFile(path, 'utf8'), 'first half, second half');
  } finally {
    await a.close();
    await b.close();
    await rm(path, { force: true });
  }
});

function openExec(client: AgentClient, fields: FieldWriter, rid: bigint, out: string[]) {
  let started!: (v: { pid: number }) => void;
  let exited!: () => void;
  const s = { started: new Promise<{ pid: number }>((r) => (started = r)), exited: new Promise<void>((r) => (exited = r)) };
  client.open(
    FrameType.EXEC,
    fields,
    {
      onFrame: (type, _flags, f, stream) => {
        if (type === FrameType.STARTED) started({ pid: f.u32('pid')! });
        if (type === FrameType.STDOUT) {
          out.push(f.bytes('data')!.toString());
          stream.consumed(f.bytes('data')!.length);
        }
        if (type === FrameType.EXITED) exited();
      },
      onError: (e) => {
        throw e;
      },
    },
    { requestId: rid },
  );
  return s;
}

test('reconnect: a command in flight survives a transport reset, output once, run once', async () => {
  const c = await agent.client({ reconnect: true });
  const api = createAgentApi(c);
  const marker = join(tmpdir(), `torpor-reconnect-${process.pid}-${Date.now()}`);
  try {
    const running = api.commands.run(`echo start; echo x >> ${marker}; sleep 0.4; echo end`);
    await sleep(150);
    await c.reconnect();
    assert.is(c.reconnects, 1);
    const r = await running;
    assert.is(r.stdout, 'start\nend\n');
    assert.is(await readFile(marker, 'utf8'), 'x\n');
    // and the session works as before
    assert.is((await api.commands.run(['echo', 'after'])).stdout, 'after\n');
    // A reset before STARTED arrives: the EXEC is re-asked under its id, still one run.
    const early = api.commands.run(`echo y >> ${marker}; echo once`);
    await c.reconnect();
    assert.is((await early).stdout, 'once\n');
    assert.is(await readFile(marker, 'utf8'), 'x\ny\n');
  } finally {
    await c.close();
    await rm(marker, { force: true });
  }
});

/** Raw connection to the agent; resolves with what the agent sent until it closed the socket. */
async function rawSession(bytes: Buffer[], hello = true): Promise<{ frames: ReturnType<FrameDecoder['push']>; closed: boolean }> {
  const sock = await dialUnix(agent.socketPath);
  const dec = new FrameDecoder();
  const frames: ReturnType<FrameDecoder['push']> = [];
  const closed = new Promise<boolean>((resolve) => {
    sock.on('data', (d) => frames.push(...dec.push(d)));
    sock.on('close', () => resolve(true));
    setTimeout(() => resolve(false), 3000);
  });
  if (hello) {
    sock.write(encodeFrame(0, FrameType.HELLO, 0, new FieldWriter().u32('version', 1).u64('features', 63n).str('name', 't').toBuffer()));
  }
  for (const b of bytes) sock.write(b);
  const wasClosed = await closed;
  sock.destroy();
  return { frames, closed: wasClosed };
}

function goawayCode(frames: { type: number; payload: Buffer }[]): string | undefined {
  const g = frames.find((f) => f.type === FrameType.GOAWAY);
  return g ? Fields.parse(g.payload).str('code') : undefined;
}

test('the agent rejects malformed and oversized frames, closes that connection, keeps serving others', async () => {
  const bystander = await agent.client();
  const api = createAgentApi(bystander);
  const oversize = Buffer.alloc(12);
  oversize.writeUInt32LE(2 * 1024 * 1024, 0);
  oversize.writeUInt32LE(1, 4);
  oversize.writeUInt16LE(FrameType.ECHO, 8);
  const badFlags = encodeFrame(1, FrameType.ECHO, 0x80, new FieldWriter().u64('request_id', 1n).toBuffer());
  const badField = encodeFrame(1, FrameType.FILE_STAT, 0, Buffer.from([10, 0, 0xff, 0xff, 0xff, 0x7f, 1, 2]));
  const evenStream = encodeFrame(2, FrameType.ECHO, 0, new FieldWriter().u64('request_id', 9n).toBuffer());
  const cases: Array<[string, Buffer[], boolean]> = [
    ['oversized length', [oversize], true],
    ['unknown flag bits', [badFlags], true],
    ['field longer than its payload', [badField], true],
    ['even stream id', [evenStream], true],
    ['request before HELLO', [encodeFrame(1, FrameType.SYNC, 0)], false],
    ['wrong version', [encodeFrame(0, FrameType.HELLO, 0, new FieldWriter().u32('version', 99).toBuffer())], false],
  ];
  for (const [what, bytes, hello] of cases) {
    const r = await rawSession(bytes, hello);
    assert.ok(r.closed, `${what}: connection closed`);
    assert.is(goawayCode(r.frames), 'PROTOCOL_ERROR', `${what}: GOAWAY PROTOCOL_ERROR`);
    assert.is((await api.commands.run(['echo', 'still here'])).stdout, 'still here\n', `${what}: others served`);
  }
  for (let i = 0; i < 20; i++) {
    const r = await rawSession([randomBytes(64 + i * 37)]);
    assert.ok(r.closed || r.frames.length >= 1, 'garbage: closed or answered');
  }
  // Unknown frame types get ERR on their stream and the connection stays.
  const unknown = await rawSession([encodeFrame(1, 1234, FLAG_END, new FieldWriter().u64('request_id', 5n).toBuffer())]);
  const err = unknown.frames.find((f) => f.stream === 1);
  assert.is(err?.type, FrameType.ERR);
  assert.is(unknown.closed, false, 'unknown type: connection kept');
  assert.ok(await bystander.ping() >= 0);
  await bystander.close();
});

/** A hostile "agent": answers HELLO, then sends what `evil` writes. */
async function hostileServer(evil: (sock: Socket) => void): Promise<{ server: Server; port: number }> {
  const server = createServer((sock) => {
    const dec = new FrameDecoder();
    sock.on('data', (d) => {
      for (const f of dec.push(d)) {
        if (f.type === FrameType.HELLO) {
          sock.write(encodeFrame(0, FrameType.HELLO, 0, new FieldWriter().u32('version', 1).u64('features', 63n).str('name', 'evil').toBuffer()));
        } else if (f.stream !== 0 && f.type !== FrameType.CREDIT) {
          evil(sock);
        }
      }
    });
    sock.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as AddressInfo).port };
}

test('the client rejects malformed and oversized frames from the agent and closes', async () => {
  const oversized = (sock: Socket) => {
    const h = Buffer.alloc(12);
    h.writeUInt32LE(1024 * 1024 + 1, 0);
    h.writeUInt32LE(1, 4);
    h.writeUInt16LE(FrameType.OK, 8);
    sock.write(h);
  };
  const overWindow = (sock: Socket) => {
    // 300 KiB of file data while the reader consumes nothing: beyond the 256 KiB window.
    sock.write(encodeFrame(1, FrameType.OK, 0, new FieldWriter().u64('size', 5 * 61440).toBuffer()));
    for (let i = 0; i < 5; i++) {
      sock.write(encodeFrame(1, FrameType.DATA, 0, new FieldWriter().bytes('data', Buffer.alloc(61440, 97)).toBuffer()));
    }
  };
  const badField = (sock: Socket) => sock.write(encodeFrame(1, FrameType.OK, FLAG_END, Buffer.from([1, 0, 9, 0, 0, 0, 1])));
  for (const [what, evil] of [['oversized', oversized], ['beyond window', overWindow], ['bad field', badField]] as const) {
    const { server, port } = await hostileServer(evil);
    const { connect } = await import('node:net');
    const c = await AgentClient.connect(connect(port, '127.0.0.1'));
    const closed = new Promise<TorporError | undefined>((r) => c.onClose(r));
    let err: unknown;
    if (what === 'beyond window') {
      const stream = await createAgentApi(c).files.read('/x', { format: 'stream' });
      await closed;
      const reader = stream.getReader();
      err = await (async () => {
        for (;;) if ((await reader.read()).done) return 'completed';
      })().catch((e) => e);
    } else {
      err = await c.call(FrameType.SYNC, new FieldWriter()).catch((e) => e);
    }
    assert.ok(code('PROTOCOL_ERROR')(err), `${what}: request fails with PROTOCOL_ERROR (${err})`);
    assert.ok(code('PROTOCOL_ERROR')(await closed), `${what}: client closed`);
    assert.ok(c.closed);
    server.close();
  }
});

test('random bytes from a hostile agent never escape as an exception: PROTOCOL_ERROR or ignored', async () => {
  let seed = 0x5eed;
  const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 0x100000000);
  const tally: Record<string, number> = {};
  for (let i = 0; i < 40; i++) {
    const garbage = Buffer.from(Array.from({ length: 8 + Math.floor(rand() * 300) }, () => Math.floor(rand() * 256)));
    // Half of the cases: a valid header on the request's stream followed by garbage fields.
    const bytes =
      i % 2
        ? garbage
        : Buffer.concat([encodeFrame(1, [FrameType.OK, FrameType.STARTED, FrameType.STDOUT, FrameType.EXITED, FrameType.ERR][i % 5]!, i % 3, garbage.subarray(0, 200))]);
    const { server, port } = await hostileServer((sock) => sock.write(bytes));
    const { connect } = await import('node:net');
    const c = await AgentClient.connect(connect(port, '127.0.0.1'));
    const closed = new Promise<TorporError | undefined>((r) => c.onClose(r));
    const outcome = await Promise.race([
      c.call(FrameType.SYNC, new FieldWriter()).then(
        () => 'answered',
        (e) => e,
      ),
      sleep(300).then(() => 'ignored'),
    ]);
    if (outcome instanceof Error) assert.instance(outcome, TorporError, `case ${i}: a typed error, not ${outcome}`);
    tally[outcome instanceof TorporError ? outcome.code : String(outcome)] = (tally[outcome instanceof TorporError ? outcome.code : String(outcome)] ?? 0) + 1;
    if (c.closed) assert.ok(code('PROTOCOL_ERROR')(await closed), `case ${i}: closed for a protocol error`);
    await c.close();
    server.close();
  }
  assert.ok((tally.PROTOCOL_ERROR ?? 0) > 10, JSON.stringify(tally));
});

test('a request stream the agent ends without its answer fails with PROTOCOL_ERROR, never waits forever', async () => {
  // Found by the host codec fuzzer (test/fuzz/host-codec-fuzz.ts): an ended stream is no longer
  // held by the connection, so these requests used to wait forever, even after it closed.
  const data = (flags: number) => encodeFrame(1, FrameType.DATA, flags, new FieldWriter().bytes('data', Buffer.from('hi')).toBuffer());
  const cases: [string, (api: ReturnType<typeof createAgentApi>) => Promise<unknown>, Buffer][] = [
    ['a read ended without its OK', (api) => api.files.read('/f'), data(FLAG_END)],
    ['a command that EXITED before STARTED', (api) => api.commands.run('true'), encodeFrame(1, FrameType.EXITED, FLAG_END, new FieldWriter().i32('exit_code', 0).toBuffer())],
    ['a command whose stream ended on STDOUT', (api) => api.commands.run('true'), Buffer.concat([encodeFrame(1, FrameType.STARTED, 0, new FieldWriter().u32('pid', 7).toBuffer()), encodeFrame(1, FrameType.STDOUT, FLAG_END, new FieldWriter().u64('offset', 0n).bytes('data', Buffer.from('x')).toBuffer())])],
    ['a STARTED without pid that also ends the stream', (api) => api.commands.run('true'), encodeFrame(1, FrameType.STARTED, FLAG_END, Buffer.alloc(0))],
  ];
  for (const [what, request, answer] of cases) {
    const { server, port } = await hostileServer((sock) => sock.write(answer));
    const { connect } = await import('node:net');
    const c = await AgentClient.connect(connect(port, '127.0.0.1'));
    try {
      const outcome = await Promise.race([request(createAgentApi(c)).then(() => 'answered', (e) => e), sleep(3000).then(() => 'still waiting')]);
      assert.ok(code('PROTOCOL_ERROR')(outcome), `${what}: ${outcome}`);
    } finally {
      await c.close();
      server.close();
    }
  }
});

test('GOAWAY from the agent fails what is in flight with its code, and the client does not redial', async () => {
  let connections = 0;
  const server = createServer((sock) => {
    connections++;
    const dec = new FrameDecoder();
    sock.on('data', (d) => {
      for (const f of dec.push(d)) {
        if (f.type === FrameType.HELLO) {
          sock.write(encodeFrame(0, FrameType.HELLO, 0, new FieldWriter().u32('version', 1).u64('features', 63n).str('name', 'leaving').toBuffer()));
        } else if (f.stream !== 0) {
          const fw = new FieldWriter().str('code', 'PROTOCOL_ERROR').str('message', 'shutting down');
          sock.end(encodeFrame(0, FrameType.GOAWAY, FLAG_END, fw.toBuffer()));
        }
      }
    });
    sock.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  const { connect } = await import('node:net');
  const c = await AgentClient.connect(
    () =>
      new Promise((resolve) => {
        const s = connect(port, '127.0.0.1', () => resolve(s));
      }),
    { reconnect: true },
  );
  const err = await c.call(FrameType.SYNC, new FieldWriter()).catch((e) => e);
  assert.ok(code('PROTOCOL_ERROR')(err), String(err));
  assert.match((err as Error).message, /shutting down/);
  await sleep(100);
  assert.is(connections, 1, 'no redial after GOAWAY');
  assert.ok(c.closed);
  server.close();
});

test.run();
