// What E2B users expect, inside a real Linux guest over vsock: the image's `user` account is the
// default (home, sudo without a password), file paths and ownership follow it, and watchDir works
// with the guest kernel's inotify. Runs only where a Linux guest can boot; elsewhere its tests are
// registered as skipped, category linux-guest, with the reason.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import type { FilesystemEvent } from '../lib/sandbox/watch.js';
import { testUnless } from './skip-unless.js';

const support = await linuxGuestSupport();
const maybe = testUnless('api-e2b-linux', support.ok ? null : `this host cannot boot a Linux guest: ${support.reason}`, 'linux-guest');

maybe("the guest's default user is `user` in /home/user, root through sudo; files and watches follow it", async () => {
  await using sbx = await Sandbox.create({ boot: { timeoutMs: 120_000 } });
  const who = await sbx.commands.run('id -un; id -u; pwd; echo $HOME');
  assert.is(who.stdout, 'user\n1000\n/home/user\n/home/user\n');
  assert.is((await sbx.commands.run('sudo -n id -u')).stdout, '0\n', 'sudo without a password');
  const root = await sbx.commands.run('id -un; pwd', { user: 'root' });
  assert.is(root.stdout, 'root\n/root\n');

  const events: FilesystemEvent[] = [];
  const watch = await sbx.files.watchDir('/home/user', (e) => void events.push(e), { recursive: true });
  await sbx.files.write('notes/today.txt', 'hello\n'); // relative: /home/user/notes/today.txt
  const info = await sbx.files.getInfo('/home/user/notes/today.txt');
  assert.is(info.owner, 'user');
  assert.is(info.group, 'user');
  assert.is(info.permissions, 'rw-r--r--');
  assert.is(await sbx.files.read('/home/user/notes/today.txt'), 'hello\n');
  assert.is((await sbx.files.getInfo('notes')).owner, 'user', 'created parents belong to the user too');
  const end = Date.now() + 5000;
  while (!events.some((e) => e.type === 'write' && e.name === 'notes/today.txt') && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.ok(events.some((e) => e.type === 'create' && e.name === 'notes'), JSON.stringify(events));
  assert.ok(events.some((e) => e.type === 'write' && e.name === 'notes/today.txt'), JSON.stringify(events));
  await watch.stop();

  await sbx.files.write('/root/secret', 'x', { user: 'root' });
  assert.is((await sbx.files.getInfo('/root/secret')).owner, 'root');
});

maybe("E2B's sandbox examples as its docs write them, only the import differs: create, run, files, list, pause, connect, kill", async () => {
  // Written as E2B code is (the names, the shapes, what is passed on), none of it torpor's own.
  const sandbox = await Sandbox.create({ timeoutMs: 300_000 });
  const result = await sandbox.commands.run('echo "ported unchanged"');
  assert.is(result.stdout, 'ported unchanged\n');
  await sandbox.files.write('/home/user/notes.txt', 'kept across pause');
  assert.is(await sandbox.files.read('/home/user/notes.txt'), 'kept across pause');
  assert.ok((await sandbox.files.list('/home/user')).some((e) => e.name === 'notes.txt'));
  const info = await sandbox.getInfo();
  assert.is(info.sandboxId, sandbox.sandboxId);
  assert.is(info.templateId, 'base');
  assert.ok(info.startedAt instanceof Date && info.endAt instanceof Date);

  const paginator = Sandbox.list();
  const firstPage = await paginator.nextItems();
  assert.ok(firstPage.some((s) => s.sandboxId === sandbox.sandboxId && s.state === 'running'));

  // E2B: `const sandboxId = await sbx.pause()`, then `Sandbox.connect(sandboxId)`.
  const background = await sandbox.commands.run('sleep 600', { background: true });
  const sandboxId = await sandbox.pause();
  const same = await Sandbox.connect(sandboxId);
  assert.is(same.sandboxId, sandbox.sandboxId);
  assert.is(await same.files.read('/home/user/notes.txt'), 'kept across pause');
  assert.ok((await same.commands.list()).some((p) => p.pid === background.pid), 'the background process lives on');

  assert.is(await Sandbox.kill(same.sandboxId), true);
  const after = await Sandbox.list({ query: { state: ['running', 'paused'] } }).nextItems();
  assert.not.ok(after.some((s) => s.sandboxId === same.sandboxId));
});

maybe('cancellation, binary output and autoResume in the Linux guest', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 600_000, lifecycle: { onTimeout: 'pause', autoResume: true } });
  try {
    // Binary: the bytes a process writes, unchanged (the same file read through files.read).
    await sbx.commands.run('head -c 300000 /dev/urandom > /tmp/blob');
    const bytes = Buffer.from(await sbx.files.read('/tmp/blob', { format: 'bytes' }));
    const cat = await sbx.commands.run(['cat', '/tmp/blob'], { encoding: 'buffer' });
    assert.ok(cat.stdout.equals(bytes), 'stdout holds the file\'s bytes');

    // An aborted foreground command: its process group is gone when run() rejects.
    const run = await sbx.commands.run('sleep 123 & sleep 124; wait', { signal: AbortSignal.timeout(500) }).catch((e: unknown) => e);
    assert.is((run as Error).name, 'AbortError');
    assert.is((await sbx.commands.run('pgrep -f "sleep 12[34]" || true')).stdout, '');

    // A pause waiting for a foreground command, aborted: the sandbox runs on, the command ends.
    const slow = sbx.commands.run('sleep 2; echo done');
    const paused = await sbx.pause({ signal: AbortSignal.timeout(300) }).catch((e: unknown) => e);
    assert.is((paused as Error).name, 'AbortError');
    assert.is(sbx.state, 'running');
    assert.is((await slow).stdout, 'done\n');

    // A foreground command that prints nothing for three times timeoutMs is not idleness: the
    // timer waits for its end (a CI run here found the sandbox 'pausing' right after a call
    // that had outlasted timeoutMs in the emulator).
    await sbx.setTimeout(1000, { onTimeout: 'pause' });
    assert.is((await sbx.commands.run('sleep 3; echo done')).stdout, 'done\n');
    assert.is(sbx.state, 'running', 'the timer did not act during the command');

    // autoResume: idle for timeoutMs, paused by the timer; the next call resumes it and runs.
    const alive = setInterval(() => undefined, 1000);
    await new Promise((r) => sbx.once('paused', r)).finally(() => clearInterval(alive));
    assert.is(sbx.state, 'paused');
    const resumed: string[] = [];
    sbx.on('resumed', (e) => resumed.push(e.from));
    assert.is((await sbx.commands.run('cat /tmp/blob | wc -c')).stdout.trim(), '300000');
    assert.is(sbx.state, 'running');
    assert.equal(resumed, ['memory'], 'resumed once, from memory, by the call');
  } finally {
    await sbx.kill();
  }
});

test.run();
