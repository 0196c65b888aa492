// The network of a Linux guest across pause and connect (docs/network.md, "Pause and resume";
// the nested host here, hardware hosts directly): a TCP connection the guest holds open to a
// host server is closed on pause (the host side sees it end with the old passt) and, after
// connect, the guest's next use of it fails at once with a reset (the device answers segments of
// flows the new passt does not know: tcp_flows.h), not a hang; the guest keeps its address and
// new connections work at once, both ways: the guest's egress, and a guest server through the
// forwarded port, whose host port getHost names again. Traffic goes only to this machine's own
// addresses.
import http from 'node:http';
import net from 'node:net';
import { networkInterfaces } from 'node:os';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { needsCommands, testUnless } from './skip-unless.js';

const support = await linuxGuestSupport();
const linuxTest = testUnless(
  'net-linux-pause',
  support.ok ? needsCommands('passt') : `this host cannot boot a Linux guest: ${support.reason}`,
  'linux-guest',
);
const BOOT = { boot: { timeoutMs: 180_000 }, memoryMiB: 256, vcpus: 1 };
const CONNECT = { restoreTimeoutMs: 120_000, bootTimeoutMs: 180_000 };

/** A non-loopback IPv4 address of this host (the nested host's eth0, a hardware host's NIC). */
function hostAddress(): string {
  for (const addrs of Object.values(networkInterfaces()))
    for (const a of addrs ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  throw new Error('this host has no non-loopback IPv4 address');
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The guest side: connect, say hello, wait for /tmp/go, then use the connection again. */
const HOLDER = (host: string, port: number) => `
import os, socket, time
s = socket.create_connection((${JSON.stringify(host)}, ${port}), timeout=20)
s.sendall(b'hello\\n')
open('/tmp/conn', 'w').write('open\\n')
while not os.path.exists('/tmp/go'):
    time.sleep(0.05)
t0 = time.monotonic()
s.settimeout(30)
try:
    for _ in range(20):
        s.sendall(b'again\\n')
        time.sleep(0.1)
    r = 'recv %r' % s.recv(100)
except Exception as e:
    r = type(e).__name__
open('/tmp/result', 'w').write('%s %.1f\\n' % (r, time.monotonic() - t0))
`;

/**
 * The guest server's directory listing through the forwarded port (getHost), tried until it
 * answers within `ms` (0: one try), each try bounded; failing, an error that names each try's cause
 * (undici's "fetch failed" alone says nothing).
 */
async function listingThrough(sbx: Sandbox, ms: number): Promise<string> {
  const end = Date.now() + ms;
  const failures: string[] = [];
  for (;;) {
    const text = await fetch(`http://${sbx.getHost(8080)}/`, { signal: AbortSignal.timeout(10_000) })
      .then((res) => res.text())
      .catch((err: Error) => {
        failures.push(`${err.message} (${String((err.cause as Error | undefined)?.message ?? err.cause)})`);
        return '';
      });
    if (text) return text;
    if (Date.now() > end) throw new Error(`the forwarded port did not answer within ${ms} ms: ${failures.join('; ')}`);
    await sleep(500);
  }
}

async function guestFile(sbx: Sandbox, path: string, ms: number): Promise<string> {
  const end = Date.now() + ms;
  for (;;) {
    const r = await sbx.commands.run(`cat ${path} 2>/dev/null || true`);
    if (r.stdout.trim()) return r.stdout.trim();
    if (Date.now() > end) throw new Error(`no ${path} in the guest after ${ms} ms`);
    await sleep(500);
  }
}

linuxTest('open connections end on pause and see a reset after connect; new ones work at once; getHost again', async () => {
  // The host's end of the guest's connection. It reads what the guest sends: a socket nobody
  // reads never sees the peer's FIN (Node emits 'end', and with it 'close', only once the
  // bytes before the FIN are consumed), so a server that did not read would wait forever for a
  // close that passt did send.
  let hostSide: net.Socket | undefined;
  let hostSideClosed = false;
  let received = '';
  const holder = net.createServer((c) => {
    hostSide = c;
    c.setEncoding('utf8');
    c.on('data', (d: string) => (received += d));
    c.on('error', () => undefined);
    c.on('close', () => (hostSideClosed = true));
  });
  await new Promise<void>((r) => holder.listen(0, '0.0.0.0', r));
  const holderPort = (holder.address() as net.AddressInfo).port;
  const body = `after-resume-${process.pid}`;
  const web = http.createServer((_req, res) => res.end(body));
  await new Promise<void>((r) => web.listen(0, '0.0.0.0', r));
  const webPort = (web.address() as net.AddressInfo).port;
  let sbx: Sandbox | undefined;
  try {
    sbx = await Sandbox.create({ ...BOOT, network: { ports: [8080] } });
    const id = sbx.sandboxId;
    await sbx.files.write('/tmp/holder.py', HOLDER(hostAddress(), holderPort));
    await sbx.commands.run('python3 /tmp/holder.py', { background: true });
    await sbx.commands.run('cd /tmp && python3 -m http.server 8080', { background: true });
    await guestFile(sbx, '/tmp/conn', 60_000);
    // The guest server listens before the pause (Python starts in seconds in the emulator: a
    // pause taken before it binds leaves nothing listening yet when the test asks right after
    // connect), and the forwarded port reaches it.
    assert.match(await listingThrough(sbx, 60_000), /holder\.py/, 'the forwarded port before the pause');
    assert.ok(hostSide, 'the host server has the guest connection');
    for (let i = 0; i < 100 && !received; i++) await sleep(50);
    assert.is(received, 'hello\n', 'the guest connection carried its first bytes to the host');
    assert.not.ok(hostSideClosed);

    await sbx.pause();
    // passt ended with the capture: the host side of every flow is closed.
    for (let i = 0; i < 100 && !hostSideClosed; i++) await sleep(50);
    assert.ok(hostSideClosed, 'the host side of the open connection ended on pause');

    sbx = await Sandbox.connect(id, CONNECT);
    assert.is((await sbx.getInfo()).resumedFrom, 'memory');
    const addr = await sbx.commands.run('ip -4 -o addr show dev eth0');
    assert.match(addr.stdout, /inet 10\.0\.2\.15\/24/, 'the guest keeps its address');
    await sbx.files.write('/tmp/go', 'go\n');
    const result = await guestFile(sbx, '/tmp/result', 90_000);
    // A reset well before the 30 s socket timeout: never a hang.
    assert.match(result, /^(ConnectionResetError|BrokenPipeError) [\d.]+$/, result);
    assert.ok(Number(result.split(' ').pop()) < 10, result);

    // New connections work at once: egress from the guest, and the forwarded port from the host.
    const r = await sbx.commands.run(['curl', '-sS', '--max-time', '20', `http://${hostAddress()}:${webPort}/`]);
    assert.is(r.stdout, body);
    // One try: the server listened before the pause, so the new passt's port answers at once.
    assert.match(await listingThrough(sbx, 0), /holder\.py/, 'the forwarded port after connect');
  } finally {
    await sbx?.kill().catch(() => undefined);
    holder.close();
    web.close();
  }
});

test.run();
