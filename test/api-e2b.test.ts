// What code ported from E2B's JS SDK expects of commands and files, against the real agent on
// the host (README: "Coming from E2B" lists what still differs).
import { randomBytes } from 'node:crypto';
import { lstat, mkdtemp, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { CommandExitError, TorporError } from '../lib/errors.js';
import { hostApi, isRoot, type HostApi } from './agent-harness.js';
import { testUnless } from './skip-unless.js';

let api: HostApi;
let dir: string;
test.before(async () => {
  api = await hostApi();
  dir = await mkdtemp(join(tmpdir(), 'torpor-e2b-'));
});
test.after(async () => {
  await api?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const code = (c: string) => (e: unknown) => e instanceof TorporError && e.code === c;
const rootTest = testUnless('api-e2b', isRoot ? null : 'the host agent is not root, so it cannot act as another user', 'root');

test('bug: makeDir over a regular file fails NOT_A_DIRECTORY; an existing directory is false', async () => {
  const file = join(dir, 'plain-file');
  await api.files.write(file, 'x');
  const err = await api.files.makeDir(file).catch((e) => e);
  assert.ok(code('NOT_A_DIRECTORY')(err), String(err));
  assert.ok(code('NOT_A_DIRECTORY')(await api.files.makeDir(join(file, 'below')).catch((e) => e)), 'a file on the way');
  assert.is(await api.files.makeDir(join(dir, 'd1')), true);
  assert.is(await api.files.makeDir(join(dir, 'd1')), false);
});

test('bug: a failed rename names the destination; rename creates the destination parents', async () => {
  const src = join(dir, 'ren-src');
  await api.files.write(src, 'moved');
  await api.files.write(join(dir, 'blocker'), 'a file, not a directory');
  const err = await api.files.rename(src, join(dir, 'blocker', 'x')).catch((e) => e);
  assert.ok(err instanceof TorporError);
  assert.match(err.message, join(dir, 'blocker', 'x'));
  const info = await api.files.rename(src, join(dir, 'new', 'deeper', 'dst'));
  assert.is(info.path, join(dir, 'new', 'deeper', 'dst'));
  assert.is(await readFile(join(dir, 'new', 'deeper', 'dst'), 'utf8'), 'moved');
  const missing = await api.files.rename(join(dir, 'no-src'), join(dir, 'dst2')).catch((e) => e);
  assert.ok(code('FILE_NOT_FOUND')(missing));
  assert.match(missing.message, 'no-src');
});

test('EntryInfo: mode with the type bits, permissions, owner and group names', async () => {
  const f = join(dir, 'perm.txt');
  await api.files.write(f, 'x', { mode: 0o640 });
  const st = await stat(f);
  const info = await api.files.getInfo(f);
  assert.is(info.mode, st.mode, 'st_mode');
  assert.is(info.mode, 0o100640);
  assert.is(info.permissions, 'rw-r-----');
  const me = (await api.commands.run(['id', '-un'])).stdout.trim();
  const myGroup = (await api.commands.run(['id', '-gn'])).stdout.trim();
  assert.is(info.owner, me);
  assert.is(info.group, myGroup);
  const d = (await api.files.list(dir)).find((e) => e.name === 'd1') ?? (await api.files.getInfo(join(dir, 'd1')));
  assert.is(d.mode & 0o170000, 0o040000, 'directory type bits');
  assert.is(d.permissions, 'rwxr-xr-x');
});

test('exists follows symlinks: a dangling link is false, getInfo still shows the link', async () => {
  const link = join(dir, 'dangling');
  await symlink(join(dir, 'nowhere'), link);
  assert.is(await api.files.exists(link), false);
  assert.is((await api.files.getInfo(link)).type, 'symlink');
  await writeFile(join(dir, 'somewhere'), 'x');
  await symlink(join(dir, 'somewhere'), join(dir, 'good-link'));
  assert.is(await api.files.exists(join(dir, 'good-link')), true);
});

test('write over an existing file keeps its mode (no mode given), as an in-place write', async () => {
  const f = join(dir, 'script.sh');
  await api.files.write(f, '#!/bin/sh\necho one\n', { mode: 0o755 });
  await api.files.write(f, '#!/bin/sh\necho two\n');
  assert.is((await stat(f)).mode & 0o7777, 0o755);
  assert.is((await api.commands.run([f])).stdout, 'two\n');
  await api.files.write(f, 'x', { mode: 0o600 });
  assert.is((await stat(f)).mode & 0o7777, 0o600, 'a given mode wins');
  await api.files.write(join(dir, 'fresh.txt'), 'x');
  assert.is((await stat(join(dir, 'fresh.txt'))).mode & 0o7777, 0o644);
});

test('remove of a missing path resolves (as E2B)', async () => {
  await api.files.remove(join(dir, 'never-existed'));
  await api.files.remove(join(dir, 'no', 'such', 'tree'));
});

test("read format 'blob' gives a Blob with the bytes", async () => {
  const data = randomBytes(70_000);
  await api.files.write(join(dir, 'b.bin'), data);
  const blob = await api.files.read(join(dir, 'b.bin'), { format: 'blob' });
  assert.instance(blob, Blob);
  assert.is(blob.size, data.length);
  assert.ok(Buffer.from(await blob.arrayBuffer()).equals(data));
});

test('requestTimeoutMs is accepted on every call and honoured', async () => {
  const o = { requestTimeoutMs: 5000 };
  await api.files.write(join(dir, 'rt'), 'x', o);
  assert.is(await api.files.read(join(dir, 'rt'), o), 'x');
  assert.ok((await api.files.list(dir, o)).length > 0);
  assert.is(await api.files.exists(join(dir, 'rt'), o), true);
  await api.files.getInfo(join(dir, 'rt'), o);
  await api.files.makeDir(join(dir, 'rt-dir'), o);
  await api.files.rename(join(dir, 'rt'), join(dir, 'rt2'), o);
  await api.files.remove(join(dir, 'rt2'), o);
  assert.is((await api.commands.run('echo hi', o)).stdout, 'hi\n');
  const h = await api.commands.run('sleep 30', { background: true, ...o });
  await api.commands.list(o);
  assert.is(await api.commands.kill(h.pid, o), true);
  await h.wait().catch(() => undefined);
  // Honoured: a stream stalled by a stopped agent times out with TIMEOUT.
  process.kill(api.agent.pid, 'SIGSTOP');
  try {
    const t0 = Date.now();
    const err = await api.files.read(join(dir, 'b.bin'), { requestTimeoutMs: 200 }).catch((e) => e);
    assert.ok(code('TIMEOUT')(err), String(err));
    assert.ok(Date.now() - t0 < 3000);
    assert.ok(code('TIMEOUT')(await api.commands.list({ requestTimeoutMs: 200 }).catch((e) => e)));
  } finally {
    process.kill(api.agent.pid, 'SIGCONT');
  }
});

test('an empty command runs and exits 0', async () => {
  const r = await api.commands.run('');
  assert.equal(r, { exitCode: 0, stdout: '', stderr: '' });
});

test("CommandExitError.error says 'exit status N' / 'signal: killed'; exitCode stays 128+n", async () => {
  const e1 = await api.commands.run('exit 3').catch((e) => e);
  assert.instance(e1, CommandExitError);
  assert.is(e1.error, 'exit status 3');
  assert.is(e1.exitCode, 3);
  const h = await api.commands.run('sleep 30', { background: true });
  await api.commands.kill(h.pid);
  const e2 = await h.wait().catch((e) => e);
  assert.instance(e2, CommandExitError);
  assert.is(e2.error, 'signal: killed');
  assert.is(h.error, 'signal: killed', 'the handle says it too');
  assert.is(e2.exitCode, 137);
  assert.is(e2.signal, 'SIGKILL');
});

test('commands.connect takes timeoutMs: wait() rejects TIMEOUT, the process keeps running', async () => {
  const h = await api.commands.run('sleep 30', { background: true });
  const view = await api.commands.connect(h.pid, { timeoutMs: 100 });
  assert.ok(code('TIMEOUT')(await view.wait().catch((e) => e)));
  assert.ok((await api.commands.list()).some((p) => p.pid === h.pid));
  await h.kill();
});

test('commands.list shows running processes only, unless includeEnded', async () => {
  const ended = await api.commands.run('true', { background: true, tag: 'ended-one' });
  await ended.wait();
  const running = await api.commands.run('sleep 30', { background: true, tag: 'running-one' });
  const list = await api.commands.list();
  assert.ok(list.every((p) => p.running));
  assert.ok(list.some((p) => p.pid === running.pid));
  assert.not.ok(list.some((p) => p.pid === ended.pid));
  const all = await api.commands.list({ includeEnded: true });
  assert.is(all.find((p) => p.pid === ended.pid)?.exitCode, 0);
  await running.kill();
});

test('a throwing onStdout rejects wait()/run(); the process keeps running', async () => {
  const boom = new Error('callback failed');
  const err = await api.commands.run('echo one; sleep 0.2; echo two', { onStdout: () => { throw boom; } }).catch((e) => e);
  assert.is(err, boom);
  const asyncBoom = new Error('async callback failed');
  const h = await api.commands.run('echo a; sleep 30', {
    background: true,
    onStderr: async () => undefined,
    onStdout: async () => {
      throw asyncBoom;
    },
  });
  assert.is(await h.wait().catch((e) => e), asyncBoom);
  const still = await api.commands.list();
  assert.ok(still.some((p) => p.pid === h.pid), 'the process still runs');
  await api.commands.kill(h.pid);
});

test('exec strings up to 128 KiB each (Linux MAX_ARG_STRLEN), e.g. python3 -c with a whole script', async () => {
  const big = 'x'.repeat(128 * 1024 - 1);
  const r = await api.commands.run(['sh', '-c', 'printf %s "$1" | wc -c', 'sh', big]);
  assert.is(r.stdout.trim(), String(big.length));
  const shell = `printf %s '${'y'.repeat(120 * 1024)}' | wc -c`;
  assert.is((await api.commands.run(shell)).stdout.trim(), String(120 * 1024));
  const env = await api.commands.run(['sh', '-c', 'printf %s "$BIG" | wc -c'], { envs: { BIG: 'z'.repeat(100_000) } });
  assert.is(env.stdout.trim(), '100000');
  assert.ok(code('INVALID_ARGUMENT')(await api.commands.run(['echo', 'x'.repeat(128 * 1024)]).catch((e) => e)));
  // About 2 MiB in all, as Linux: 15 arguments of 120 KiB (1.76 MiB) in one command.
  const args = Array.from({ length: 15 }, (_, i) => String.fromCharCode(97 + i).repeat(120 * 1024));
  const all = await api.commands.run(['sh', '-c', 'for a; do printf %s "$a"; done | wc -c', 'sh', ...args]);
  assert.is(all.stdout.trim(), String(15 * 120 * 1024));
  // Such a process is still listed (its strings cut to 64 KiB in the listing, which is one frame).
  const bigArgv = await api.commands.run(['sh', '-c', 'sleep 30', 'sh', ...args], { background: true, tag: 'big-argv' });
  const small = await api.commands.run(['sleep', '30'], { background: true, tag: 'small-argv' });
  const entries = await api.commands.list();
  const bigEntry = entries.find((p) => p.pid === bigArgv.pid);
  assert.ok(bigEntry, 'a process with 1.76 MiB of arguments is listed');
  assert.is(bigEntry!.tag, 'big-argv');
  assert.equal(bigEntry!.args.slice(0, 1), ['-c']);
  assert.ok(entries.some((p) => p.pid === small.pid), 'and so are the others');
  await bigArgv.kill();
  await small.kill();
});

test('background commands have no default timeout; foreground ones 60 s (documented)', async () => {
  const { toExecRequest } = await import('../lib/sandbox/commands.js');
  assert.is(toExecRequest('x', { background: true }).timeoutMs, undefined);
  assert.is(toExecRequest('x', {}).timeoutMs, 60_000);
  assert.is(toExecRequest('x', { background: true, timeoutMs: 60_000 }).timeoutMs, 60_000);
});

test('an agent whose default user does not exist says so (commands and relative file paths)', async () => {
  const odd = await hostApi({ user: 'no-such-user-xyz' });
  try {
    const run = await odd.commands.run('true').catch((e) => e);
    assert.ok(code('INVALID_ARGUMENT')(run) && /no-such-user-xyz/.test(run.message), String(run));
    assert.ok(code('INVALID_ARGUMENT')(await odd.files.read('relative.txt').catch((e) => e)));
    // Naming a user that exists works as before.
    const me = (await api.commands.run(['id', '-un'])).stdout.trim();
    assert.is((await odd.commands.run(['id', '-un'], { user: me })).stdout.trim(), me);
  } finally {
    await odd.close();
  }
});

test('pty and requestTimeoutMs: create, resize, sendInput and kill accept it', async () => {
  let out = '';
  const term = await api.pty.create({ cols: 80, rows: 24, onData: (d) => void (out += Buffer.from(d).toString()), cmd: ['cat'], requestTimeoutMs: 5000 });
  await api.pty.resize(term.pid, { cols: 100, rows: 30 }, { requestTimeoutMs: 5000 });
  await api.pty.sendInput(term.pid, 'ping\n', { requestTimeoutMs: 5000 });
  const end = Date.now() + 3000;
  while (!out.includes('ping') && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
  assert.match(out, 'ping');
  assert.is(await api.pty.kill(term.pid, { requestTimeoutMs: 5000 }), true);
});

rootTest('default user from the agent (--user): commands run as it, in its home', async () => {
  const asRoot = await hostApi({ user: 'root' });
  const asNobody = await hostApi({ user: 'nobody' });
  try {
    const r = await asRoot.commands.run('id -un; pwd; echo $HOME $USER');
    assert.is(r.stdout, 'root\n/root\n/root root\n');
    const n = await asNobody.commands.run(['id', '-un']);
    assert.is(n.stdout.trim(), 'nobody');
    assert.is((await asNobody.commands.run(['id', '-un'], { user: 'root' })).stdout.trim(), 'root', "user: 'root' still works");
    const term = await asNobody.pty.create({ cols: 80, rows: 24, onData: () => undefined });
    await term.kill();
    const unknown = await asRoot.commands.run('true', { user: 'no-such-user-xyz' }).catch((e) => e);
    assert.ok(code('INVALID_ARGUMENT')(unknown));
  } finally {
    await asRoot.close();
    await asNobody.close();
  }
});

rootTest('user on file calls: relative paths from the home, created files owned by the user', async () => {
  const name = `torpor-e2b-${process.pid}-${Date.now()}`;
  try {
    await api.files.write(`${name}/f.txt`, 'rel', { user: 'root' });
    assert.is(await readFile(join('/root', name, 'f.txt'), 'utf8'), 'rel');
    assert.is(await api.files.read(`${name}/f.txt`, { user: 'root' }), 'rel');
    assert.ok((await api.files.list(name, { user: 'root' })).some((e) => e.name === 'f.txt'));
  } finally {
    await rm(join('/root', name), { recursive: true, force: true });
  }
  const owned = join(dir, 'owned', 'by', 'nobody.txt');
  await api.files.write(owned, 'x', { user: 'nobody' });
  const st = await stat(owned);
  assert.is(st.uid, 65534);
  assert.is((await stat(join(dir, 'owned'))).uid, 65534, 'created parents too');
  const info = await api.files.getInfo(owned);
  assert.is(info.owner, 'nobody');
  await api.files.makeDir(join(dir, 'nobodys-dir'), { user: 'nobody' });
  assert.is((await lstat(join(dir, 'nobodys-dir'))).uid, 65534);
  assert.ok(code('INVALID_ARGUMENT')(await api.files.read('x', { user: 'no-such-user-xyz' }).catch((e) => e)));
});

test.run();
