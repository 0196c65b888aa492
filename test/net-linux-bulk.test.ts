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

/** How a transfer went: what arrived, and the longest wait for a chunk (a stall shows there,
 *  a slow but steady stream does not). */
interface Transfer {
  bytes?: Buffer;
  count: number;
  seconds: number;
  longestGapS: number;
  error?: string;
}

/** GET `url`, bounded by progress rather than by a deadline: it fails when no byte has arrived
 *  for `stallMs`, or past `totalMs` in all. The nested host's speed depends on what else its
 *  host runs (CI runs a second L1 beside it): a 64 MiB transfer took 118 s in one clean-clone
 *  run and more than 300 s in another, steadily. Throughput is the benchmarks' business; this
 *  test is about the bytes arriving whole. Says every 30 s how far it got. */
async function fetchCounting(url: string, stallMs: number, totalMs: number): Promise<Transfer> {
  const chunks: Buffer[] = [];
  const start = performance.now();
  let count = 0;
  let last = start;
  let longestGap = 0;
  let reported = start;
  const stop = new AbortController();
  const watch = setInterval(() => {
    const now = performance.now();
    if (now - last > stallMs) stop.abort(new Error(`no byte for ${Math.round((now - last) / 1000)} s`));
    else if (now - start > totalMs) stop.abort(new Error(`past ${totalMs / 1000} s in all`));
    if (now - reported >= 30_000) {
      reported = now;
      const mib = count / (1 << 20);
      step(`${mib.toFixed(1)} MiB so far (${(mib / ((now - start) / 1000)).toFixed(2)} MiB/s)`);
    }
  }, 1_000);
  const result = (error?: string): Transfer => ({
    bytes: error ? undefined : Buffer.concat(chunks),
    count,
    seconds: (performance.now() - start) / 1000,
    longestGapS: Math.max(longestGap, performance.now() - last) / 1000,
    error,
  });
  try {
    const res = await fetch(url, { signal: stop.signal });
    if (!res.ok || !res.body) return result(`status ${res.status}`);
    for await (const chunk of res.body) {
      const now = performance.now();
      longestGap = Math.max(longestGap, now - last);
      last = now;
      chunks.push(Buffer.from(chunk));
      count += chunk.length;
    }
    return result();
  } catch (err) {
    return result(String(stop.signal.reason ?? err));
  } finally {
    clearInterval(watch);
  }
}

/** The guest's TCP counters that tell loss from slowness: segments sent and retransmitted. */
async function guestTcpCounters(sbx: Sandbox): Promise<string> {
  const snmp = (await sbx.commands.run('cat /proc/net/snmp')).stdout.split('\n').filter((l) => l.startsWith('Tcp:'));
  if (snmp.length < 2) return 'no Tcp lines in /proc/net/snmp';
  const names = snmp[0]!.split(/\s+/);
  const values = snmp[1]!.split(/\s+/);
  return ['OutSegs', 'RetransSegs'].map((n) => `${n} ${values[names.indexOf(n)]}`).join(', ');
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
  // Then the transfer: a stall fails the test instead of hanging the suite (60 s without a
  // byte), and the whole stays well inside the suite's limit for a file (900 s).
  const got = await fetchCounting(`http://${host}/blob`, 60_000, 720_000);
  const tcp = await guestTcpCounters(sbx).catch((err: unknown) => `guest TCP counters unread: ${String(err)}`);
  step(`${got.count} bytes in ${got.seconds.toFixed(1)} s, longest wait for a chunk ${got.longestGapS.toFixed(1)} s; guest ${tcp}`);
  assert.ok(got.bytes, `the ${MIB} MiB transfer completed (${got.count} bytes arrived; ${got.error})`);
  const bytes = got.bytes;
  assert.is(bytes!.length, MIB << 20);
  assert.is(createHash('sha256').update(bytes!).digest('hex'), guestSum);
  step('fetched and checked; ending the sandbox');
});

test.run();
