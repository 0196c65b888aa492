// commands.run / list / connect / sendStdin / kill against the real agent on the host.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { CommandExitError, OutputLimitError, TorporError } from '../lib/errors.js';
import { hostApi, isRoot, sleep, until, type HostApi } from './agent-harness.js';
import { testUnless } from './skip-unless.js';

let api: HostApi;
test.before(async () => {
  api = await hostApi();
});
test.after(async () => {
  await api?.close();
});

const code = (c: string) => (e: unknown) => e instanceof TorporError && e.code === c;

test('stdout, stderr and the exit code are kept apart', async () => {
  const r = await api.commands.run('echo out; echo err >&2; exit 3', { throwOnError: false });
  assert.equal(r, { exitCode: 3, stdout: 'out\n', stderr: 'err\n', error: 'exit status 3' });
  try {
    await api.commands.run('echo partial; echo bad >&2; exit 7');
    assert.unreachable('should throw');
  } catch (err) {
    assert.instance(err, CommandExitError);
    const e = err as CommandExitError;
    assert.is(e.code, 'COMMAND_EXIT');
    assert.is(e.exitCode, 7);
    assert.is(e.stdout, 'partial\n');
    assert.is(e.stderr, 'bad\n');
  }
});

test('argv form runs without a shell', async () => {
  const r = await api.commands.run(['printf', '%s|', 'a b', '$HOME', "it's"]);
  assert.is(r.stdout, "a b|$HOME|it's|");
  const missing = await api.commands.run(['/nonexistent/program'], { throwOnError: false }).catch((e) => e);
  assert.ok(missing instanceof TorporError, 'a missing program is an error or a non-zero exit');
});

test('envs and cwd', async () => {
  const r = await api.commands.run('echo "$FOO-$BAR"; pwd', { envs: { FOO: 'foo value', BAR: 'x=y' }, cwd: '/tmp' });
  assert.is(r.stdout, 'foo value-x=y\n/tmp\n');
});

testUnless('api-commands', isRoot ? null : 'the host agent is not root, so it cannot switch users', 'root')('user: run as nobody', async () => {
  const r = await api.commands.run(['id', '-un'], { user: 'nobody' });
  assert.is(r.stdout.trim(), 'nobody');
  const unknown = await api.commands.run(['true'], { user: 'no-such-user-xyz' }).catch((e) => e);
  assert.instance(unknown, TorporError);
});

test('stdin round trip: background handle, and the stdin option', async () => {
  const h = await api.commands.run(['cat'], { background: true, stdin: true });
  await h.sendStdin('hello ');
  await h.sendStdin(new Uint8Array([0x77, 0x6f, 0x72, 0x6c, 0x64]));
  await h.closeStdin();
  const r = await h.wait();
  assert.is(r.stdout, 'hello world');
  const big = 'z'.repeat(300_000);
  const wc = await api.commands.run(['wc', '-c'], { stdin: big });
  assert.is(wc.stdout.trim(), '300000');
  // A program that exits without reading its input: the exit status is the answer.
  const early = await api.commands.run(['sh', '-c', 'exit 0'], { stdin: 'x'.repeat(500_000) });
  assert.is(early.exitCode, 0);
});

test('10 MiB of output arrives complete and in order', async () => {
  const n = 1_300_000; // seq 1..n is ~9.9 MB
  let viaCallback = 0;
  const r = await api.commands.run(['seq', '1', String(n)], {
    onStdout: (s) => {
      viaCallback += s.length;
    },
  });
  const lines = r.stdout.split('\n');
  assert.is(lines.length, n + 1);
  for (let i = 0; i < n; i += 9973) assert.is(lines[i], String(i + 1));
  assert.is(lines[n - 1], String(n));
  assert.is(viaCallback, r.stdout.length);
  const bytes = await api.commands.run('head -c 10485760 /dev/zero | tr "\\0" a');
  assert.is(bytes.stdout.length, 10485760);
  assert.ok(/^a+$/.test(bytes.stdout));
});

test("encoding: 'buffer' delivers bytes unchanged: result, callbacks, handle, errors, connect, maxBuffer", async () => {
  // 3 MiB of random bytes (invalid UTF-8 everywhere, split across many frames) in a host file
  // the agent reads: the default decoding mangles them, 'buffer' keeps every byte.
  const dir = mkdtempSync(join(tmpdir(), 'torpor-bin-'));
  try {
    const bytes = randomBytes(3 * 1024 * 1024);
    const file = join(dir, 'blob');
    writeFileSync(file, bytes);
    const pieces: Buffer[] = [];
    const r = await api.commands.run(['cat', file], { encoding: 'buffer', onStdout: (b) => void pieces.push(b) });
    assert.ok(Buffer.isBuffer(r.stdout) && Buffer.isBuffer(r.stderr));
    assert.ok(r.stdout.equals(bytes), 'the result holds the bytes written');
    assert.ok(Buffer.concat(pieces).equals(bytes), 'the callback pieces join to the bytes written');
    assert.ok(pieces.length > 1, `several pieces (${pieces.length})`);
    const text = await api.commands.run(['cat', file]);
    assert.ok(!Buffer.from(text.stdout, 'utf8').equals(bytes), 'utf8 (the default) does not keep binary');

    // stderr, a non-zero exit and the error's output are bytes too.
    const fail = await api.commands.run(['sh', '-c', `head -c 1000 '${file}' >&2; exit 3`], { encoding: 'buffer' }).catch((e) => e);
    assert.instance(fail, CommandExitError);
    assert.ok((fail as CommandExitError<Buffer>).stderr.equals(bytes.subarray(0, 1000)));
    assert.is((fail as CommandExitError<Buffer>).exitCode, 3);

    // A background handle and a reattach from an offset: bytes, no gap, no duplicate.
    const h = await api.commands.run(['sh', '-c', `head -c 4096 '${file}'; read x; tail -c +4097 '${file}' | head -c 4096`], {
      background: true,
      stdin: true,
      encoding: 'buffer',
    });
    await until(() => h.stdout.length === 4096, 5000, 'the first 4 KiB');
    assert.ok(h.stdout.equals(bytes.subarray(0, 4096)));
    await h.disconnect();
    const again = await api.commands.connect(h.pid, { fromOffset: 100, encoding: 'buffer' });
    await api.commands.sendStdin(h.pid, 'go\n');
    const end = await again.wait();
    assert.ok(end.stdout.equals(bytes.subarray(100, 8192)), 'replayed from byte 100 to the end');

    // maxBuffer keeps exactly the head, as bytes.
    const over = await api.commands.run(['cat', file], { encoding: 'buffer', maxBuffer: 5000 }).catch((e) => e);
    assert.instance(over, OutputLimitError);
    assert.ok((over as OutputLimitError<Buffer>).stdout.equals(bytes.subarray(0, 5000)));

    const bad = await api.commands.run('true', { encoding: 'latin1' as never }).catch((e) => e);
    assert.ok(code('INVALID_ARGUMENT')(bad), String(bad));
    assert.match(String(bad), /'utf8', 'buffer'/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('background: listed, reattached from an offset with no gap or duplicate, killed', async () => {
  const script = 'i=0; while :; do echo line$i; i=$((i+1)); sleep 0.005; done';
  const h = await api.commands.run(script, { background: true, tag: 'ticker' });
  await until(() => h.stdout.split('\n').length > 20, 5000, 'first lines');
  await h.disconnect();
  const firstPart = h.stdout;
  const offsets = h.offsets;
  assert.is(offsets.stdout, Buffer.byteLength(firstPart));
  await sleep(100); // output continues while nobody listens

  const listed = await api.commands.list();
  const me = listed.find((p) => p.pid === h.pid);
  assert.ok(me, 'listed');
  assert.is(me!.running, true);
  assert.is(me!.tag, 'ticker');
  assert.is(me!.cmd, '/bin/bash');

  const again = await api.commands.connect(h.pid, { fromOffset: offsets });
  await until(() => again.stdout.split('\n').length > 40, 5000, 'more lines');
  assert.is(await api.commands.kill(h.pid), true);
  const end = await again.wait().catch((e) => e);
  const all = (firstPart + again.stdout).split('\n').filter(Boolean);
  all.forEach((line, i) => assert.is(line, `line${i}`));
  assert.ok(all.length > 40);
  assert.ok(end instanceof CommandExitError, 'killed -> non-zero');
  assert.is((end as CommandExitError).signal, 'SIGKILL');
  assert.is(await api.commands.kill(h.pid), false, 'a dead process cannot be killed again');
  await until(async () => !(await api.commands.list()).find((p) => p.pid === h.pid)?.running, 3000, 'not running');
});

test('OUTPUT_LOST when the offset fell out of the kept tail; a kept offset replays exactly', async () => {
  const total = 3 * 1024 * 1024;
  const h = await api.commands.run(`head -c ${total} /dev/zero | tr "\\0" q`, { background: true });
  await h.disconnect();
  await until(async () => (await api.commands.list({ includeEnded: true })).find((p) => p.pid === h.pid)?.running === false, 10000, 'exit');
  const lost = await api.commands.connect(h.pid, { fromOffset: { stdout: 0, stderr: 0 } }).catch((e) => e);
  assert.ok(code('OUTPUT_LOST')(lost), `expected OUTPUT_LOST, got ${lost}`);
  const tail = await api.commands.connect(h.pid, { fromOffset: { stdout: total - 1000, stderr: 0 } });
  const r = await tail.wait();
  assert.is(r.stdout, 'q'.repeat(1000));
  assert.is(r.exitCode, 0);
  // Without an offset: the oldest kept byte onwards (the agent keeps the last 1 MiB).
  const dflt = await api.commands.connect(h.pid);
  const all = await dflt.wait();
  assert.is(all.stdout.length, 1024 * 1024);
  assert.is(dflt.offsets.stdout, total);
});

test('maxBuffer: a stream past it kills the process and rejects OUTPUT_LIMIT with the kept head', async () => {
  const MiB = 1024 * 1024;
  let seen = 0;
  const t0 = Date.now();
  const err = await api.commands
    .run(`echo start >&2; head -c ${3 * MiB} /dev/zero | tr "\\0" x; sleep 30`, {
      maxBuffer: MiB,
      tag: 'over-limit',
      onStdout: (s) => {
        seen += s.length;
      },
    })
    .catch((e) => e);
  assert.instance(err, OutputLimitError);
  const e = err as OutputLimitError;
  assert.is(e.code, 'OUTPUT_LIMIT');
  assert.is(e.stream, 'stdout');
  assert.is(e.maxBuffer, MiB);
  assert.match(e.message, /stdout/);
  assert.match(e.message, /1048576/);
  assert.match(e.message, /maxBuffer/);
  assert.is(e.stdout.length, MiB, 'the output kept is exactly the limit');
  assert.ok(/^x+$/.test(e.stdout));
  assert.is(e.stderr, 'start\n');
  assert.ok(seen >= MiB, `onStdout saw ${seen} bytes`);
  assert.ok(Date.now() - t0 < 20_000, 'killed, not waited for the sleep');
  const listed = (await api.commands.list({ includeEnded: true })).filter((p) => p.tag === 'over-limit');
  assert.is(listed.length, 1, 'listed (as ended)');
  assert.is(listed[0]!.running, false, 'the process is not running any more');
});

test('maxBuffer: stderr, background handles, connect, and Infinity', async () => {
  const MiB = 1024 * 1024;
  const h = await api.commands.run(`head -c ${2 * MiB} /dev/zero | tr "\\0" e >&2`, { background: true, maxBuffer: MiB / 2 });
  const err = await h.wait().catch((e) => e);
  assert.ok(err instanceof OutputLimitError && err.stream === 'stderr', String(err));
  assert.is((err as OutputLimitError).stderr.length, MiB / 2);
  assert.ok(h.stderr.length <= MiB / 2, 'the handle keeps no more than the limit either');
  // A replay through connect counts toward the limit too (the agent still keeps its last 1 MiB).
  const replay = await api.commands.connect(h.pid, { maxBuffer: 1000 });
  const r2 = await replay.wait().catch((e) => e);
  assert.ok(r2 instanceof OutputLimitError && r2.stderr.length === 1000, String(r2));
  // throwOnError: false does not hide a truncated result; Infinity lifts the limit.
  const t = await api.commands.run(['seq', '1', '100000'], { maxBuffer: 1000, throwOnError: false }).catch((e) => e);
  assert.ok(t instanceof OutputLimitError);
  const inf = await api.commands.run(['seq', '1', '100000'], { maxBuffer: Infinity });
  assert.is(inf.stdout.split('\n').length, 100001);
  // Exactly at the limit is fine; a multi-byte character is never kept split.
  const exact = await api.commands.run(['printf', 'abcd'], { maxBuffer: 4 });
  assert.is(exact.stdout, 'abcd');
  const utf = await api.commands.run(['printf', 'a\u00e9\u00e9'], { maxBuffer: 4 }).catch((e) => e);
  assert.ok(utf instanceof OutputLimitError);
  assert.is((utf as OutputLimitError).stdout, 'a\u00e9');
});

test('maxBuffer: invalid values are INVALID_ARGUMENT', async () => {
  for (const v of [-1, 1.5, NaN, -Infinity, '10', null]) {
    const r = await api.commands.run('true', { maxBuffer: v as never }).catch((e) => e);
    assert.ok(code('INVALID_ARGUMENT')(r), `run maxBuffer ${String(v)}: ${r}`);
    const c = await api.commands.connect(1, { maxBuffer: v as never }).catch((e) => e);
    assert.ok(code('INVALID_ARGUMENT')(c), `connect maxBuffer ${String(v)}: ${c}`);
  }
  const ok = await api.commands.run('true', { maxBuffer: 0 });
  assert.is(ok.exitCode, 0);
});

test('connect fromOffset: a number is stdout only; an omitted stream resumes from its kept tail', async () => {
  const MiB = 1024 * 1024;
  const h = await api.commands.run(`echo hello; head -c ${2 * MiB} /dev/zero | tr "\\0" e >&2; echo bye`, { background: true });
  await h.disconnect();
  await until(async () => (await api.commands.list({ includeEnded: true })).find((p) => p.pid === h.pid)?.running === false, 10000, 'exit');
  const byNumber = await api.commands.connect(h.pid, { fromOffset: 0 });
  const r = await byNumber.wait();
  assert.is(r.stdout, 'hello\nbye\n');
  assert.is(r.stderr.length, MiB, 'stderr from the oldest kept byte');
  assert.equal(byNumber.offsets, { stdout: 10, stderr: 2 * MiB });
  const stdoutOnly = await (await api.commands.connect(h.pid, { fromOffset: { stdout: 6 } })).wait();
  assert.is(stdoutOnly.stdout, 'bye\n');
  const lost = await api.commands.connect(h.pid, { fromOffset: { stderr: 0 } }).catch((e) => e);
  assert.ok(code('OUTPUT_LOST')(lost), `expected OUTPUT_LOST, got ${lost}`);
  assert.match((lost as Error).message, /stderr/);
  const bad = await api.commands.connect(h.pid, { fromOffset: { stdout: 0, bogus: 1 } as never }).catch((e) => e);
  assert.ok(code('INVALID_ARGUMENT')(bad));
});

test('timeoutMs kills the command and throws TIMEOUT', async () => {
  const t0 = Date.now();
  const err = await api.commands.run('echo before; sleep 10', { timeoutMs: 1000 }).catch((e) => e);
  assert.ok(code('TIMEOUT')(err), String(err));
  assert.is((err as { stdout?: string }).stdout, 'before\n');
  assert.ok(Date.now() - t0 < 6000);
});

test('a foreground command whose agent stops answering ends in TIMEOUT a grace after timeoutMs, not never', async () => {
  // The agent is stopped (SIGSTOP) once the command's first output arrives: it neither kills the
  // command at timeoutMs nor reports anything, as a stuck guest would not.
  const own = await hostApi();
  try {
    const t0 = Date.now();
    const err = await own.commands
      .run('echo go; sleep 30', { timeoutMs: 1000, onStdout: () => void process.kill(own.agent.pid, 'SIGSTOP') })
      .catch((e) => e);
    const took = Date.now() - t0;
    assert.ok(code('TIMEOUT')(err), String(err));
    assert.match(String(err.message), /reported no end within timeoutMs \(1000 ms\) and 5000 ms more/);
    assert.ok(took >= 5900 && took < 12_000, `gave up after ${took} ms (timeoutMs 1000 + 5000 grace)`);
  } finally {
    process.kill(own.agent.pid, 'SIGCONT');
    await own.close();
  }
});

test('bad arguments are INVALID_ARGUMENT before anything runs', async () => {
  const bad: Array<() => Promise<unknown>> = [
    () => api.commands.run([]),
    () => api.commands.run('true', { timeoutMs: -1 }),
    () => api.commands.run('true', { envs: { 'A=B': 'x' } }),
    () => api.commands.run('true', { bogus: 1 } as never),
    () => api.commands.connect(0),
    () => api.commands.kill(1, 'SIGNOPE' as never),
  ];
  for (const b of bad) assert.ok(code('INVALID_ARGUMENT')(await b().catch((e) => e)));
  assert.ok(code('PROCESS_NOT_FOUND')(await api.commands.connect(4_000_000).catch((e) => e)));
});

test('100 concurrent commands on one connection', async () => {
  const runs = Array.from({ length: 100 }, (_, i) =>
    i % 2 ? api.commands.run(['echo', `argv-${i}`]) : api.commands.run(`echo shell-${i}; echo e${i} >&2`),
  );
  const results = await Promise.all(runs);
  results.forEach((r, i) => {
    assert.is(r.stdout, i % 2 ? `argv-${i}\n` : `shell-${i}\n`);
    assert.is(r.stderr, i % 2 ? '' : `e${i}\n`);
  });
});

test.run();
