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

test.run();
