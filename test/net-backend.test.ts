// The network backend's plumbing without a guest: passt started as a sandbox starts it, fed
// Ethernet frames in QEMU's stream protocol on its socket (what the virtio-net device sends),
// answering as the guest's gateway; its failures as NET_BACKEND errors, never a hang.
import { closeSync, fstatSync, openSync } from 'node:fs';
import net from 'node:net';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { GUEST_NET, macFor, netCmdline, resolveNetwork } from '../lib/net/options.js';
import { Passt, passtArgs } from '../lib/net/passt.js';
import { Machine } from '../lib/vm/machine.js';
import { GUEST_MAC, arpRequest, framed, ipBytes, nextFrame, socketPair } from './net-frames.js';
import { needsCommands, testUnless } from './skip-unless.js';

const withPasst = testUnless('net-backend', needsCommands('passt'), 'tools');

test('network options: defaults, MAC derivation, the agent command line', () => {
  assert.equal(resolveNetwork('n', undefined), { egress: true, allowHostLoopback: false, ports: [] });
  assert.equal(resolveNetwork('n', { ports: [8080, 8080, 22], egress: false }), { egress: false, allowHostLoopback: false, ports: [8080, 22] });
  assert.is(resolveNetwork('n', false), false);
  for (const bad of [{ ports: [0] }, { ports: [70000] }, { ports: '80' }, { egress: 'yes' }, { bogus: 1 }, 'x']) {
    assert.throws(() => resolveNetwork('n', bad), (e: unknown) => e instanceof TorporError && e.code === 'INVALID_ARGUMENT');
  }
  const mac = macFor('sbx_0123');
  assert.match(mac, /^02(:[0-9a-f]{2}){5}$/);
  assert.is(macFor('sbx_0123'), mac);
  assert.is.not(macFor('sbx_0124'), mac);
  assert.is(netCmdline(), 'torpor.net=10.0.2.15/24,10.0.2.2,10.0.2.3');
  const args = passtArgs({ egress: true, allowHostLoopback: false, ports: [] }, new Map([[8080, 40000]]));
  assert.ok(args.includes('--no-map-gw'));
  assert.ok(args.join(' ').includes('--tcp-ports 127.0.0.1/40000:8080'));
  const open = passtArgs({ egress: false, allowHostLoopback: true, ports: [] }, new Map());
  assert.not.ok(open.includes('--no-map-gw'));
  assert.ok(open.includes('--no-udp'));
});

test('Machine.closeNetSocket closes only the ends of Machine.netSocketPair() (once), never another fd', () => {
  const [a, b] = Machine.netSocketPair();
  const code = (fn: () => void) => {
    try {
      fn();
    } catch (err) {
      return (err as TorporError).code;
    }
    return 'no error';
  };
  const devNull = openSync('/dev/null', 'r');
  try {
    assert.is(code(() => Machine.closeNetSocket(devNull)), 'INVALID_ARGUMENT', 'an fd fs opened');
    assert.ok(fstatSync(devNull).isCharacterDevice(), 'and left open');
  } finally {
    closeSync(devNull);
  }
  Machine.closeNetSocket(a);
  assert.is(code(() => Machine.closeNetSocket(a)), 'INVALID_ARGUMENT', 'closed twice');
  Machine.closeNetSocket(b);
});

withPasst('passt answers an ARP request for the gateway over the stream protocol', async () => {
  const [ours, theirs] = await socketPair();
  const passt = await Passt.start({ fd: theirs, network: { egress: true, allowHostLoopback: false, ports: [] } });
  try {
    ours.write(framed(arpRequest()));
    const reply = await nextFrame(ours, (f) => f.readUInt16BE(12) === 0x0806 && f.readUInt16BE(20) === 2);
    assert.equal([...reply.subarray(0, 6)], [...GUEST_MAC], 'sent to the guest');
    assert.equal([...reply.subarray(28, 32)], [...ipBytes(GUEST_NET.gateway)], 'the gateway answers');
    const rss = await passt.rssBytes();
    assert.ok(rss !== undefined && rss > 0);
  } finally {
    ours.destroy();
    await passt.stop();
  }
  assert.ok(passt.exited);
});

withPasst('passt binds forwarded ports on 127.0.0.1 before start() resolves; it exits when the socket closes', async () => {
  const [ours, theirs] = await socketPair();
  const passt = await Passt.start({ fd: theirs, network: { egress: true, allowHostLoopback: false, ports: [8080] } });
  const host = passt.hostPorts.get(8080)!;
  let unexpected: TorporError | undefined;
  passt.onUnexpectedExit((e) => (unexpected = e));
  const c = net.connect(host, '127.0.0.1');
  await new Promise<void>((resolve, reject) => {
    c.once('connect', () => resolve());
    c.once('error', reject);
  });
  c.destroy();
  ours.destroy(); // the machine went away: --one-off ends passt
  const deadline = Date.now() + 5000;
  while (!passt.exited && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  assert.ok(passt.exited, 'passt ended with its socket');
  assert.ok(unexpected instanceof TorporError && unexpected.code === 'NET_BACKEND');
  await passt.stop();
});

test('a missing passt binary is NET_BACKEND, not a hang', async () => {
  const [ours, theirs] = await socketPair();
  try {
    await Passt.start({ fd: theirs, binary: '/nonexistent/passt', network: { egress: true, allowHostLoopback: false, ports: [] } });
    assert.unreachable('started');
  } catch (e) {
    assert.ok(e instanceof TorporError && e.code === 'NET_BACKEND', String(e));
    assert.match((e as Error).message, /not installed/);
  } finally {
    ours.destroy();
  }
});

test('a backend that exits at start is NET_BACKEND with its status, not a hang', async () => {
  const [ours, theirs] = await socketPair();
  try {
    await Passt.start({ fd: theirs, binary: 'false', network: { egress: true, allowHostLoopback: false, ports: [8080] } });
    assert.unreachable('started');
  } catch (e) {
    assert.ok(e instanceof TorporError && e.code === 'NET_BACKEND', String(e));
    assert.match((e as Error).message, /exited with status 1/);
  } finally {
    ours.destroy();
  }
});

test.run();
