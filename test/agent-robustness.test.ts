// The agent's bounds and its resistance to hostile or careless clients (host binary, always runs):
// memory kept for ended processes, answers backing up on a client that does not read, and the
// client side's promises and timers on close.
import { readFileSync } from 'node:fs';
import { rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { encodeFrame } from '../lib/agent/frame.js';
import { FieldWriter } from '../lib/agent/fields.js';
import { dialUnix } from '../lib/agent/host.js';
import { FrameType, PROTOCOL_VERSION } from '../lib/agent/protocol.js';
import { TorporError } from '../lib/errors.js';
import { createAgentApi } from '../lib/sandbox/agent-api.js';
import { hostApi, sleep, type HostApi } from './agent-harness.js';

let api: HostApi;
test.before(async () => {
  api = await hostApi();
});
test.after(async () => {
  await api?.close();
});

const code = (c: string) => (e: unknown) => e instanceof TorporError && e.code === c;
const MiB = 1024 * 1024;

function agentRssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : 0;
}

test('ended processes share a 16 MiB output budget: the oldest lose their tails first, keep their exit status', async () => {
  // 20 ended processes with 1 MiB of kept stdout each: 4 MiB over the budget.
  const pids: number[] = [];
  for (let i = 0; i < 20; i++) {
    const h = await api.commands.run(['head', '-c', String(MiB), '/dev/zero'], { background: true });
    const r = await h.wait();
    assert.is(r.stdout.length, MiB);
    pids.push(h.pid);
  }
  await sleep(50); // the agent trims on its next tick
  const oldest = await api.commands.connect(pids[0]!, { fromOffset: { stdout: 0, stderr: 0 } }).catch((e) => e);
  assert.ok(code('OUTPUT_LOST')(oldest), `the oldest ended process's output was dropped (got ${oldest})`);
  const status = await (await api.commands.connect(pids[0]!)).wait();
  assert.equal([status.exitCode, status.stdout], [0, ''], 'its exit status is still there');
  const newest = await (await api.commands.connect(pids[19]!, { fromOffset: { stdout: 0, stderr: 0 } })).wait();
  assert.is(newest.stdout.length, MiB, 'the newest keeps its whole tail');
});

test('a client that floods requests and never reads: the agent holds back, stays bounded, serves others', async () => {
  const sock = await dialUnix(api.agent.socketPath);
  try {
    sock.pause(); // never read a byte of the answers
    sock.write(encodeFrame(0, FrameType.HELLO, 0, new FieldWriter().u32('version', PROTOCOL_VERSION).toBuffer()));
    const big = new FieldWriter().bytes('data', Buffer.alloc(MiB - 64, 7)).toBuffer();
    // 96 MiB of ECHO requests: without a bound the agent would hold all of their answers.
    for (let i = 0; i < 96; i++) sock.write(encodeFrame(2 * i + 1, FrameType.ECHO, 0, big));
    await sleep(1500);
    const rss = agentRssKiB(api.agent.pid);
    console.log(`  agent RSS with 96 MiB of unread ECHO requests: ${rss} KiB`);
    // ASan's quarantine keeps freed memory resident: the bound holds for the real build only.
    if (!/asan/.test(process.env.TORPOR_AGENT_BIN ?? '')) {
      assert.ok(rss < 48 * 1024, `agent RSS ${rss} KiB while one client does not read`);
    }
    const r = await api.commands.run(['echo', 'still here']);
    assert.is(r.stdout, 'still here\n');
  } finally {
    sock.destroy();
  }
});

test('requests opened while the client reconnects go out once it is back (no reissue plan needed)', async () => {
  const c = await api.agent.client({ reconnect: true });
  const files = createAgentApi(c).files;
  try {
    const back = c.reconnect(); // the transport is down from here until the new HELLO
    const read = files.read('/proc/self/cmdline'); // FILE_READ: a stream with no reissue plan
    const stat = files.getInfo('/');
    await back;
    const [r, st] = await Promise.allSettled([read, stat]);
    assert.ok(r.status === 'fulfilled' && /torpor-agent/.test(r.value), `FILE_READ: ${r.status === 'rejected' ? r.reason : 'ok'}`);
    assert.ok(st.status === 'fulfilled' && st.value.type === 'dir', `FILE_STAT: ${st.status === 'rejected' ? st.reason : 'ok'}`);
    assert.is(c.reconnects, 1);
  } finally {
    await c.close();
  }
});

test('close settles everything in flight with CONNECTION_CLOSED and leaves no timer behind', async () => {
  const c = await api.agent.client();
  const a = createAgentApi(c);
  const h = await a.commands.run(['sleep', '30'], { background: true });
  const waiting = h.wait().catch((e) => e);
  const reading = a.files.read('/dev/zero', { format: 'stream' }).then(async (s) => {
    const r = s.getReader();
    for (;;) await r.read();
  }).catch((e) => e);
  const call = c.call(FrameType.ECHO, new FieldWriter().bytes('data', Buffer.alloc(10)), { timeoutMs: 60_000 });
  await call;
  const slow = c.call(FrameType.SYNC, new FieldWriter(), { timeoutMs: 60_000 }).catch((e) => e);
  await sleep(20);
  await c.close();
  for (const r of [await waiting, await reading]) assert.ok(code('CONNECTION_CLOSED')(r), String(r));
  const s = await slow;
  assert.ok(s === undefined || s instanceof Object, 'the SYNC settled');
  await api.commands.kill(h.pid);
  // A left-over 60 s timer would keep the process alive: none of the calls' timers remain.
  const timers = process.getActiveResourcesInfo().filter((x) => x === 'Timeout');
  assert.is(timers.length, 0, `active timers after close: ${timers.join(', ')}`);
});

test('STDIN still being written when the transport resets: re-asked under its id, written once', async () => {
  const c = await api.agent.client({ reconnect: true });
  const a = createAgentApi(c);
  const out = join(tmpdir(), `torpor-stdin-once-${process.pid}-${Date.now()}`);
  try {
    // The reader starts late: 200 KiB cannot fit the 64 KiB pipe, so the write is pending.
    const h = await a.commands.run(['sh', '-c', `sleep 0.7; cat > ${out}`], { background: true, stdin: true });
    const data = Buffer.alloc(200 * 1024, 0x61);
    const rid = (BigInt(Date.now()) << 16n) | 0x5151n;
    const sent = c.call(FrameType.STDIN, new FieldWriter().u32('pid', h.pid).bytes('data', data), { requestId: rid });
    await sleep(150);
    await c.reconnect(); // the STDIN stream dies with the old transport; the client re-asks it
    await sent;
    await a.commands.closeStdin(h.pid);
    await h.wait();
    assert.is((await stat(out)).size, data.length, 'the bytes were written exactly once');
  } finally {
    await c.close();
    await rm(out, { force: true });
  }
});

test('a client that never reads the GOAWAY it earned is cut off after 2 s, not kept forever', async () => {
  const sock = await dialUnix(api.agent.socketPath);
  try {
    sock.pause();
    sock.write(encodeFrame(0, FrameType.HELLO, 0, new FieldWriter().u32('version', PROTOCOL_VERSION).toBuffer()));
    const big = new FieldWriter().bytes('data', Buffer.alloc(MiB - 64, 1)).toBuffer();
    // 6 MiB of answers the client will not read, queued ahead of the GOAWAY...
    for (let i = 0; i < 6; i++) sock.write(encodeFrame(2 * i + 1, FrameType.ECHO, 0, big));
    // ...that a frame with an unknown flag bit earns.
    const bad = encodeFrame(101, FrameType.ECHO, 0);
    bad.writeUInt16LE(0x80, 10);
    sock.write(bad);
    const t0 = Date.now();
    while (!/GOAWAY not read in time/.test(api.agent.diagnostics().stderr) && Date.now() - t0 < 6000) await sleep(50);
    assert.match(api.agent.diagnostics().stderr, /GOAWAY not read in time/);
  } finally {
    sock.destroy();
  }
});

test.run();
