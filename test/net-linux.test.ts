// The sandbox network through a real Linux guest (the nested host here, hardware hosts
// directly): the agent configured eth0 and resolv.conf from the command line, curl in the
// guest reaches a server this test runs on the host (through egress, and through the
// opt-in host loopback mapping), the host's loopback is unreachable by default and all
// egress is with `egress: false`, and the host fetches from a guest server through a
// forwarded port, bytes checked. Traffic goes only to this machine's own addresses.
import http from 'node:http';
import type net from 'node:net';
import { networkInterfaces } from 'node:os';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { sandboxIdentity } from '../lib/sandbox/identity.js';
import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { needsCommands, testUnless } from './skip-unless.js';

const support = await linuxGuestSupport();
const maybe = testUnless(
  'net-linux',
  support.ok ? needsCommands('passt') : `this host cannot boot a Linux guest: ${support.reason}`,
  'linux-guest',
);
const boot = { timeoutMs: 180_000 };

/** An HTTP server answering `body` on every path, on `host` (a free port). */
async function serve(host: string, body: string): Promise<{ port: number; close: () => Promise<void> }> {
  const srv = http.createServer((_req, res) => res.end(body));
  await new Promise<void>((r) => srv.listen(0, host, r));
  return {
    port: (srv.address() as net.AddressInfo).port,
    close: () => new Promise<void>((r) => srv.close(() => r())),
  };
}

/** A non-loopback IPv4 address of this host (the nested host's eth0, a hardware host's NIC). */
function hostAddress(): string {
  for (const addrs of Object.values(networkInterfaces()))
    for (const a of addrs ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  throw new Error('this host has no non-loopback IPv4 address');
}

const curl = (url: string) => ['curl', '-sS', '--max-time', '20', url];

/** What the guest says its identity is: kernel hostname, /etc/hostname, what its own name
 *  resolves to (IPv4 only: an IPv6 lookup would fall through to DNS), /etc/machine-id, eth0's MAC. */
async function identityIn(sbx: Sandbox): Promise<string[]> {
  const r = await sbx.commands.run('uname -n; cat /etc/hostname; getent ahostsv4 "$(uname -n)" | head -n1 | cut -d" " -f1; cat /etc/machine-id /sys/class/net/eth0/address');
  return r.stdout.trim().split('\n');
}

function expectedIdentity(sbx: Sandbox): string[] {
  const id = sandboxIdentity(sbx.sandboxId);
  return [id.hostname, id.hostname, '127.0.1.1', id.machineId, id.mac];
}

maybe('the agent configured eth0 and resolv.conf; curl reaches a host server through egress', async () => {
  const body = `egress-${process.pid}-${Date.now()}`;
  const srv = await serve('0.0.0.0', body);
  try {
    await using sbx = await Sandbox.create({ boot });
    const addr = await sbx.commands.run('ip -4 -o addr show dev eth0');
    assert.match(addr.stdout, /inet 10\.0\.2\.15\/24/);
    const route = await sbx.commands.run('ip route show default');
    assert.match(route.stdout, /default via 10\.0\.2\.2 dev eth0/);
    assert.is((await sbx.files.read('/etc/resolv.conf')).trim(), 'nameserver 10.0.2.3');
    const r = await sbx.commands.run(curl(`http://${hostAddress()}:${srv.port}/`));
    assert.is(r.stdout, body);
  } finally {
    await srv.close();
  }
});

maybe("the host's 127.0.0.1 is unreachable by default and reachable at the gateway with allowHostLoopback", async () => {
  const body = `loopback-${process.pid}-${Date.now()}`;
  const srv = await serve('127.0.0.1', body);
  try {
    {
      await using sbx = await Sandbox.create({ boot });
      const r = await sbx.commands.run(['curl', '-sS', '--max-time', '5', `http://10.0.2.2:${srv.port}/`], { throwOnError: false });
      assert.is.not(r.exitCode, 0, 'the default must not reach the host loopback');
      assert.is.not(r.stdout, body);
    }
    {
      await using sbx = await Sandbox.create({ boot, network: { allowHostLoopback: true } });
      const r = await sbx.commands.run(curl(`http://10.0.2.2:${srv.port}/`));
      assert.is(r.stdout, body);
    }
  } finally {
    await srv.close();
  }
});

maybe('egress: false stops the guest reaching anything; the loopback mapping still works when allowed', async () => {
  const body = `noegress-${process.pid}-${Date.now()}`;
  const open = await serve('0.0.0.0', body);
  try {
    await using sbx = await Sandbox.create({ boot, network: { egress: false, allowHostLoopback: true } });
    const out = await sbx.commands.run(['curl', '-sS', '--max-time', '5', `http://${hostAddress()}:${open.port}/`], { throwOnError: false });
    assert.is.not(out.exitCode, 0, 'egress off: the host address is not reachable');
    const loop = await sbx.commands.run(curl(`http://10.0.2.2:${open.port}/`));
    assert.is(loop.stdout, body);
  } finally {
    await open.close();
  }
});

maybe('each sandbox has its own hostname, machine-id and MAC, kept across pause and connect; its network works with them', async () => {
  const body = `identity-${process.pid}-${Date.now()}`;
  const srv = await serve('0.0.0.0', body);
  let a: Sandbox | undefined;
  try {
    // From the template (restored with the template's identity, renamed on RESUMED) and booted.
    a = await Sandbox.create({ boot, network: { ports: [8080] } });
    await using b = await Sandbox.create({ boot, template: false });
    assert.match(a.sandboxId.replace('_', '-'), /^sbx-[0-9a-f]{16}$/);
    assert.equal(await identityIn(a), expectedIdentity(a));
    assert.equal(await identityIn(b), expectedIdentity(b));
    // The renamed interface carries traffic both ways: egress, and a forwarded port into the guest.
    assert.is((await a.commands.run(curl(`http://${hostAddress()}:${srv.port}/`))).stdout, body);
    await a.commands.run('mkdir -p /tmp/www && echo served > /tmp/www/index.html && cd /tmp/www && python3 -m http.server 8080', { background: true });
    const fetchGuest = async (sbx: Sandbox): Promise<string> => {
      for (let i = 0; ; i++) {
        const text = await fetch(`http://${sbx.getHost(8080)}/`, { signal: AbortSignal.timeout(10_000) }).then((res) => res.text(), () => '');
        if (text || i === 120) return text;
        await new Promise((r) => setTimeout(r, 500));
      }
    };
    assert.is(await fetchGuest(a), 'served\n');

    const id = a.sandboxId;
    await a.pause();
    a = await Sandbox.connect(id);
    assert.equal(await identityIn(a), expectedIdentity(a), 'the same identity after connect');
    assert.is(await fetchGuest(a), 'served\n', 'the forwarded port after connect, before the guest sends anything');
    assert.is((await a.commands.run(curl(`http://${hostAddress()}:${srv.port}/`))).stdout, body);
  } finally {
    await a?.kill().catch(() => undefined);
    await srv.close();
  }
});

test.run();
