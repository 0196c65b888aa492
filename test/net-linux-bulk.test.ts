// A guest `python3 -m http.server` fetched from the host through a forwarded port
// (sbx.getHost), 64 MiB with its sha256 (TORPOR_BULK_MIB: 1024 on a hardware host): the guest's side of a bulk transfer through the device,
// the stream backend and passt (docs/network.md). Run it alone:
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
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let t0 = 0;
/** One line per step, so that a run that stalls says at which (a CI run sat silent in this file). */
const step = (what: string) => console.log(`  net-linux-bulk: ${((performance.now() - t0) / 1000).toFixed(1)} s: ${what}`);

/** GET `url` within `ms`; counts the bytes as they arrive so a failure says how far it got. */
async function fetchCounting(url: string, ms: number): Promise<{ bytes?: Buffer; count: number; error?: string }> {
  const chunks: Buffer[] = [];
  let count = 0;
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(ms) });
    if (!res.ok || !res.body) return { count, error: `status ${res.status}` };
    for await (const chunk of res.body) {
      chunks.push(Buffer.from(chunk));
      count += chunk.length;
    }
    return { bytes: Buffer.concat(chunks), count };
  } catch (err) {
    return { count, error: String(err) };
  }
}

const MIB = Number(process.env.TORPOR_BULK_MIB ?? 64);

maybe(`a guest http.server is fetched from the host through getHost(port), ${MIB} MiB with its sha256`, async () => {
  t0 = performance.now();
  step('creating the sandbox');
  await using sbx = await Sandbox.create({ boot, network: { ports: [8080] } });
  step(`created (${(await sbx.getInfo()).createdFrom}); writing ${MIB} MiB in the guest`);
  await sbx.commands.run(`mkdir -p /tmp/srv && head -c ${MIB << 20} /dev/urandom > /tmp/srv/blob`);
  const guestSum = (await sbx.commands.run('sha256sum /tmp/srv/blob')).stdout.split(' ')[0];
  step('starting the guest server');
  await sbx.commands.run(['python3', '-m', 'http.server', '8080', '--directory', '/tmp/srv'], { background: true });
  const host = sbx.getHost(8080);
  assert.match(host, /^127\.0\.0\.1:\d+$/);
  // Until the guest's server listens, a connection through the forwarded port is reset: ask
  // for the small directory listing, each try bounded on its own, until it answers.
  const ready = Date.now() + 120_000;
  let listing = '';
  while (!listing.includes('blob') && Date.now() < ready) {
    listing = await fetch(`http://${host}/`, { signal: AbortSignal.timeout(10_000) })
      .then((r) => (r.ok ? r.text() : ''))
      .catch(() => '');
    if (!listing) await sleep(500);
  }
  assert.match(listing, /blob/, 'the guest server answered through the forwarded port');
  step('the server answered; fetching the blob');
  // Then the transfer, bounded as a whole (a stall fails the test instead of hanging the suite).
  const got = await fetchCounting(`http://${host}/blob`, 300_000);
  assert.ok(got.bytes, `the ${MIB} MiB transfer completed (${got.count} bytes arrived; ${got.error})`);
  const bytes = got.bytes;
  assert.is(bytes!.length, MIB << 20);
  assert.is(createHash('sha256').update(bytes!).digest('hex'), guestSum);
  step('fetched and checked; ending the sandbox');
});

test.run();
