// A guest `python3 -m http.server` fetched from the host through a forwarded port
// (sbx.getHost), 16 MiB with its sha256. NOT in the nested suite's KVM_FILES yet: in the one
// nested run it got (2026-12-01) the transfer hung with the emulator idle, cause not found
// before the deadline (docs/network.md, Known limits). Run it alone:
//   flock /tmp/nested.lock npm run test:linux -- "node --import tsx node_modules/uvu/bin.js test 'net-linux-bulk\.test\.ts$'"
import { createHash } from 'node:crypto';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { needsCommands, testUnless } from './skip-unless.js';

const support = await linuxGuestSupport();
const maybe = testUnless(
  'net-linux-bulk',
  support.ok ? needsCommands('passt') : `this host cannot boot a Linux guest: ${support.reason}`,
  'linux-guest',
);
const boot = { timeoutMs: 180_000 };

maybe('a guest http.server is fetched from the host through getHost(port), 16 MiB with its sha256', async () => {
  await using sbx = await Sandbox.create({ boot, network: { ports: [8080] } });
  await sbx.commands.run('mkdir -p /tmp/srv && head -c 16777216 /dev/urandom > /tmp/srv/blob');
  const guestSum = (await sbx.commands.run('sha256sum /tmp/srv/blob')).stdout.split(' ')[0];
  await sbx.commands.run(['python3', '-m', 'http.server', '8080', '--directory', '/tmp/srv'], { background: true });
  const host = sbx.getHost(8080);
  assert.match(host, /^127\.0\.0\.1:\d+$/);
  let bytes: Buffer | undefined;
  // Retried until the guest's server listens; bounded as a whole, so a stalled transfer fails
  // this test instead of hanging the suite.
  const deadline = Date.now() + 300_000;
  while (!bytes && Date.now() < deadline) {
    bytes = await fetch(`http://${host}/blob`, { signal: AbortSignal.timeout(Math.max(1000, deadline - Date.now())) })
      .then(async (r) => (r.ok ? Buffer.from(await r.arrayBuffer()) : undefined))
      .catch(() => undefined);
    if (!bytes) await new Promise((r) => setTimeout(r, 500));
  }
  assert.ok(bytes, 'the guest server answered through the forwarded port');
  assert.is(bytes!.length, 16 << 20);
  assert.is(createHash('sha256').update(bytes!).digest('hex'), guestSum);
});

test.run();
