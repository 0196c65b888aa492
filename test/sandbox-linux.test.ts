// The API through a real Linux guest over vsock. Runs only where a Linux guest can boot (a
// hardware-virtualization host with the kernel set up, or TORPOR_KERNEL on a PVM host);
// elsewhere its tests are registered as skipped, category linux-guest, with the reason.
import { createHash, randomBytes } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

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
