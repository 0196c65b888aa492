// The API through a real Linux guest over vsock. Runs only where a Linux guest can boot (a
// hardware-virtualization host with the kernel set up, or TORPOR_KERNEL on a PVM host);
// elsewhere its tests are registered as skipped, category linux-guest, with the reason.
import { createHash, randomBytes } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { sandboxIdentity } from '../lib/sandbox/identity.js';
import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { allOrNone } from './all-or-none.js';
import { testUnless } from './skip-unless.js';

const support = await linuxGuestSupport();
const maybe = testUnless('sandbox-linux', support.ok ? null : `this host cannot boot a Linux guest: ${support.reason}`, 'linux-guest');

maybe('uname, python3 arithmetic and a file round trip in one sandbox', async () => {
  await using sbx = await Sandbox.create({ boot: { timeoutMs: 120_000 } });
  assert.match(sbx.id, /^sbx_[0-9a-f]{16}$/);
  const uname = await sbx.commands.run('uname -a');
  assert.match(uname.stdout, /^Linux /);
  const py = await sbx.commands.run(['python3', '-c', 'print(6*7)']);
  assert.is(py.stdout, '42\n');
  const data = randomBytes(1 << 20);
  await sbx.files.write('/tmp/blob', data);
  const back = await sbx.files.read('/tmp/blob', { format: 'bytes' });
  assert.is(createHash('sha256').update(back).digest('hex'), createHash('sha256').update(data).digest('hex'));
  assert.ok(sbx.consoleLog().length > 0);
});

maybe("checkpoint and restore: a bad step undone, the files and a python process's memory as they were", async () => {
  await using sbx = await Sandbox.create({ boot: { timeoutMs: 120_000 } });
  // A python process holding its state only in memory, answering on a FIFO.
  await sbx.commands.run('mkfifo /tmp/ask /tmp/answer; echo v1 > /home/user/app.txt; mkdir -p /home/user/project/src; seq 1 1000 > /home/user/project/src/data.txt');
  const server = `
import sys
n = 0
while True:
    with open('/tmp/ask') as q:
        cmd = q.read().strip()
    if cmd == 'inc':
        n += 1
    with open('/tmp/answer', 'w') as a:
        a.write(str(n))
`;
  await sbx.files.write('/tmp/server.py', server);
  await sbx.commands.run('python3 /tmp/server.py', { background: true });
  const ask = async (cmd: string) => (await sbx.commands.run(`echo ${cmd} > /tmp/ask; cat /tmp/answer`)).stdout;
  assert.is(await ask('inc'), '1');
  const good = await sbx.checkpoint('good');
  assert.is(sbx.state, 'running');

  // The bad step: a file overwritten, one removed, the process's state moved on.
  await sbx.commands.run('echo broken > /home/user/app.txt; rm /tmp/server.py; echo new > /home/user/extra.txt; rm -rf /home/user/project; sync');
  assert.not.ok(await sbx.files.exists('/home/user/project'));
  assert.is(await ask('inc'), '2');
  assert.is(await ask('inc'), '3');

  await sbx.restore(good);
  assert.is(await sbx.files.read('/home/user/app.txt'), 'v1\n');
  assert.ok(await sbx.files.exists('/tmp/server.py'));
  assert.not.ok(await sbx.files.exists('/home/user/extra.txt'));
  assert.is((await sbx.commands.run('wc -l < /home/user/project/src/data.txt')).stdout, '1000\n', 'the directory rm -rf removed is back');
  assert.is(await ask('get'), '1', "the process's memory as it was at the checkpoint");
  assert.is(await ask('inc'), '2');
  assert.equal((await sbx.checkpoints()).map((c) => c.label), ['good']);
});

maybe('fork(2): the children draw different random numbers, their files diverge, the parent runs on', async () => {
  await using parent = await Sandbox.create({ boot: { timeoutMs: 120_000 } });
  await parent.files.write('/home/user/shared.txt', 'before the fork');
  const kids = await parent.fork(2);
  try {
    // New processes in each: /dev/urandom and python's random (seeded from it) differ per child.
    const draw = async (s: Sandbox) =>
      (await s.commands.run(`head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; python3 -c 'import random; print(random.random())'`)).stdout;
    const draws = await Promise.all([parent, ...kids].map(draw));
    assert.is(new Set(draws).size, 3, draws.join(' | '));
    for (const kid of kids) assert.is(await kid.files.read('/home/user/shared.txt'), 'before the fork');
    await kids[0]!.files.write('/home/user/shared.txt', 'child 0');
    await kids[1]!.files.write('/home/user/shared.txt', 'child 1');
    await parent.files.write('/home/user/shared.txt', 'parent');
    assert.equal(
      await Promise.all([parent, ...kids].map((s) => s.files.read('/home/user/shared.txt'))),
      ['parent', 'child 0', 'child 1'],
    );
    assert.is((await kids[0]!.getInfo()).forkedFrom, parent.sandboxId);
    // Each its own hostname, machine-id and MAC (the parent keeps its own).
    const identities = await Promise.all(
      [parent, ...kids].map(async (s) => (await s.commands.run('uname -n; cat /etc/machine-id /sys/class/net/eth0/address')).stdout.trim().split('\n')),
    );
    identities.forEach((got, i) => {
      const want = sandboxIdentity([parent, ...kids][i]!.sandboxId);
      assert.equal(got, [want.hostname, want.machineId, want.mac]);
    });
  } finally {
    await Promise.allSettled(kids.map((k) => k.kill()));
  }
});

maybe('8 sandboxes at once', async () => {
  const boxes = await allOrNone(
    Array.from({ length: 8 }, () => Sandbox.create({ memoryMiB: 256, vcpus: 1, boot: { timeoutMs: 180_000 } })),
    (b) => b.kill(),
  );
  try {
    const outs = await Promise.all(boxes.map((b, i) => b.commands.run(['python3', '-c', `print(${i}*${i})`])));
    outs.forEach((r, i) => assert.is(r.stdout, `${i * i}\n`));
    assert.is(new Set(boxes.map((b) => b.id)).size, 8);
  } finally {
    await Promise.all(boxes.map((b) => b.kill()));
  }
});

test.run();
